"""What only a simulation knows: the cost model that timed its steps, and capacity answers found by search.

A simulated run is a ``RunResult`` like any other (source ``simulated``); these parts ride along
in it (``cost_model``, ``capacity``). ``capacity`` answers a planner's questions per target (the
workload's engine, and each ``plan:`` entry the GPU model can time) and per bucket:

- ``knee``: the lowest closed-loop concurrency at which the engine's scheduler preempts, found by
  simulating every concurrency from the lowest that could preempt upwards (None: no concurrency up
  to the bucket's ``num_requests`` preempts);
- ``max_concurrency`` / ``max_request_rate``: the highest closed-loop concurrency and open-loop
  request rate (Poisson) at which at least ``attainment_target`` of the requests meet every SLO,
  with the output tokens/s and goodput there (None: not even concurrency 1 or the lowest rate
  searched meets it; or the workload sets no SLO; or ``burst_meets_slo``: all of the bucket's
  requests arriving at once still meet it, so no request rate is too high for them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

DEFAULT_ATTAINMENT = 0.95


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class CostModelInfo(_Part):
    """How a simulation timed its steps: ``kind`` calibrated (a step-time model fitted on a measured
    run of this engine), gpu (a roofline of a GPU's FLOP/s and bandwidth) or replay (a measured
    run's own step times); what it came from and its numbers (``parameters``)."""

    kind: Literal["calibrated", "gpu", "replay"]
    description: str
    source: str = ""
    machine: str = ""
    r2: float | None = None
    parameters: dict[str, Any] = {}


class SloPoint(_Part):
    """One searched load level: ``level`` (concurrency, or requests/s), the fraction of its
    requests meeting every SLO, and its output tokens/s and goodput (requests/s)."""

    level: int | float
    slo_attainment: float
    output_tokens_per_s: float | None
    goodput_rps: float | None


class BucketCapacity(_Part):
    """One bucket's answers on one target (see the module docstring)."""

    name: str
    knee: int | None = None
    max_concurrency: SloPoint | None = None
    max_request_rate: SloPoint | None = None
    burst_meets_slo: bool = False  # all the bucket's requests at once meet it: no rate is too high for them


class TargetCapacity(_Part):
    """The answers for one target: ``target`` is ``engine`` (the workload's engine section) or
    ``plan[i]``; model, GPU (None for the engine), tp and KV dtype say what it is."""

    target: str
    model: str
    gpu: str | None = None
    tp: int = 1
    kv_cache_dtype: str
    attainment_target: float = DEFAULT_ATTAINMENT
    buckets: list[BucketCapacity] = []

    def bucket(self, name: str) -> BucketCapacity | None:
        return next((b for b in self.buckets if b.name == name), None)
