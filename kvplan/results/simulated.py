"""What only a simulation knows: the cost model that timed its steps, and capacity answers found by search.

A simulated run is a ``RunResult`` like any other (source ``simulated``); these parts ride along
in it (``cost_model``, ``capacity``). ``capacity`` answers a planner's questions per target (the
workload's engine, and each ``plan:`` entry the GPU model can time) and per bucket:

- ``knee``: the closed-loop concurrency at which the engine's scheduler starts to preempt (one that
  preempts while the one below does not), found by bisection up to ``max_num_seqs``
  (kvplan.run.sim.search; None: ``max_num_seqs`` in flight never preempt);
- ``max_concurrency`` / ``max_request_rate``: the highest closed-loop concurrency (at most
  ``max_num_seqs``) and open-loop request rate (Poisson) at which at least ``attainment_target`` of
  the measured requests of a steady-state level meet every SLO, with the output tokens/s and
  goodput there (None: not even concurrency 1 or the lowest rate searched meets it; or the
  workload sets no SLO; or ``burst_meets_slo``: the SLO holds at the scheduler's own limit and
  bounds TPOT only, which a growing queue never breaks, so no rate is too high); an answer at a
  limit names it (``concurrency_bound``: max_num_seqs, or max_users for 8 x max_num_seqs users,
  the search's cap; ``request_rate_bound``: saturation, the
  requests/s that max_num_seqs in flight serve, past which the queue grows without bound);
- ``above_concurrency`` / ``above_request_rate``: the lowest level seen failing above each
  maximum, with its attainment, so the edge shows.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
    step_times: str = Field(
        "",
        description='What times each step: "silicon: <system> / <backend> <version>" (aiconfigurator-core\'s'
        ' measured database), "roofline", "calibrated" or "replay"; "" in runs written before it existed.',
    )
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
    ttft_p99_ms: float | None = Field(
        None, description="P99 TTFT of the level's measured requests, ms; None: none completed (or an older run)."
    )
    tpot_p99_ms: float | None = Field(
        None, description="P99 TPOT of the level's measured requests, ms; None: none had two tokens (or an older run)."
    )


class BucketCapacity(_Part):
    """One bucket's answers on one target (see the module docstring)."""

    name: str
    knee: int | None = None
    max_concurrency: SloPoint | None = None
    max_request_rate: SloPoint | None = None
    burst_meets_slo: bool = False  # the SLO holds at the scheduler's own limits: no rate is too high
    concurrency_bound: str | None = None  # "max_num_seqs" | "max_users": the SLO still held at that limit
    request_rate_bound: str | None = None  # "saturation": the SLO still held at what max_num_seqs serve
    above_concurrency: SloPoint | None = None  # the lowest concurrency seen failing above max_concurrency
    above_request_rate: SloPoint | None = None  # the lowest rate seen failing above max_request_rate


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
    step_times: str = Field(
        "", description='CostModelInfo.step_times of this target\'s clock; "" in runs written before it existed.'
    )
    weight_dtype: str | None = Field(
        None, description="A GPU target's weight dtype as given (auto: the checkpoint's own); None for the engine."
    )
    ep: int = Field(1, description="A GPU target's expert-parallel size.")
    dp: int = Field(1, description="A GPU target's attention data-parallel size (an instance is tp x dp GPUs).")
    backend: str | None = Field(
        None, description="A GPU target's serving engine (vllm, sglang, trtllm); None for the engine."
    )
    disagg: str | None = Field(
        None,
        description="A disaggregated target's pools and link (``2P tp2 + 3D tp4 over rdma-400g``: prefill"
        " workers and their tp, decode workers and theirs); None: one engine per replica.",
    )

    def bucket(self, name: str) -> BucketCapacity | None:
        return next((b for b in self.buckets if b.name == name), None)
