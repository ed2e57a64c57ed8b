"""The run-result metrics a CI gate may hold: which field, which way is worse, how far it may move.

The catalog lives with the run result it points into (``Metric.field`` is an attribute path of
the engine facts, a BucketSummary or a LevelSummary), so the workload schema (its ``gate:``
section) and kvplan.gate both read it without depending on each other.

A check is one metric at one scope: the whole run (KV bytes per token, pool tokens), one bucket
(its knee), or one load level of a bucket (``short c=8``). A tolerance says which way is worse
and how far the current value may move that way from the baseline, in numpy.isclose's form::

    allowed = abs + rel x |baseline|
    worse: higher  ->  regression when current > baseline + allowed
    worse: lower   ->  regression when current < baseline - allowed

Capacity metrics default to zero tolerance. In a closed-loop level with fixed request lengths and
ignore_eos, every scheduling decision (admission, block allocation, preemption) depends only on
token counts and the free blocks, never on the clock or on which tokens were sampled, so the KV
trace, the knee and the preemption counts repeat exactly from run to run and from machine to
machine. Timing metrics default to generous relative tolerances: CI machines are noisy. Open-loop
levels arrive by the clock, so their capacity metrics can move too; give them a tolerance.

A metric whose value is missing (``None``: no completed request, no level that preempted) ranks
as the worst possible value, except the knee, where ``None`` means no level of the sweep preempted:
the best outcome.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Worse = Literal["higher", "lower"]
Scope = Literal["run", "bucket", "level"]


class Tolerance(BaseModel):
    """How far a metric may move the worse way: ``abs`` (in the metric's unit) + ``rel`` x
    |baseline|. ``worse`` defaults to the catalog's direction for the metric."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    worse: Worse | None = Field(
        None,
        description="Which way is a regression, ``higher`` or ``lower``; null = the metric's own direction"
        " from the catalog.",
    )
    abs: Annotated[float, Field(ge=0)] = Field(
        0.0,
        description="The allowed move the worse way in the metric's unit (ms, tokens, blocks, requests,"
        " ...), added to rel x |baseline|.",
    )
    rel: Annotated[float, Field(ge=0)] = Field(
        0.0, description="The allowed move the worse way as a fraction of |baseline| (0.5 = 50 %), added to abs."
    )

    def limit(self, baseline: float) -> float:
        """The worst current value that still passes (``baseline`` as ranked, may be +-inf)."""
        if math.isinf(baseline):
            return baseline
        allowed = self.abs + self.rel * abs(baseline)
        return baseline + allowed if self.worse == "higher" else baseline - allowed

    def holds(self, current: float, limit: float) -> bool:
        return current <= limit if self.worse == "higher" else current >= limit

    def describe(self) -> str:
        """``+0``, ``-50%``, ``+100% +20``: the allowed move, signed the worse way."""
        sign = "+" if self.worse == "higher" else "-"
        parts = ([f"{sign}{self.rel * 100:g}%"] if self.rel else []) + ([f"{sign}{self.abs:g}"] if self.abs else [])
        return " ".join(parts) or f"{sign}0"


@dataclass(frozen=True)
class Metric:
    """One gated metric: where its value sits in results.json (``field``, dotted, within the
    scope's section), which way is worse, and its default tolerance."""

    name: str
    scope: Scope
    field: str
    worse: Worse
    default: Tolerance
    unit: str
    none_is_best: bool = False
    # held only where the baseline level ran without preemption: at a pool-bound level the
    # peak is the pool's size, not the demand, so a larger pool legitimately raises it
    held_if_clean: bool = False

    def tolerance(self, override: Tolerance | None = None) -> Tolerance:
        """``override`` (a whole tolerance) or the default, with ``worse`` filled in."""
        chosen = override or self.default
        return chosen if chosen.worse else chosen.model_copy(update={"worse": self.worse})

    def rank(self, value: float | None, worse: Worse) -> float:
        """``value`` as a number to compare; None is the worst value (best for the knee)."""
        if value is not None:
            return float(value)
        worst = math.inf if worse == "higher" else -math.inf
        return -worst if self.none_is_best else worst


_EXACT = Tolerance()
METRICS: tuple[Metric, ...] = (
    # the engine's KV bytes per token (all layers, K and V) and the tokens its pool holds
    Metric("kv_bytes_per_token", "run", "bytes_per_token", "higher", _EXACT, "bytes"),
    Metric("kv_pool_tokens", "run", "pool_tokens", "lower", _EXACT, "tokens"),
    # lowest closed-loop concurrency with preemptions (None: none preempted), highest clean one below
    Metric("measured_knee", "bucket", "measured_knee", "lower", _EXACT, "requests", none_is_best=True),
    Metric("max_clean_concurrency", "bucket", "max_clean_concurrency", "lower", _EXACT, "requests"),
    Metric("peak_used_blocks", "level", "peak_used_blocks", "higher", _EXACT, "blocks", held_if_clean=True),
    Metric("num_preemptions", "level", "num_preemptions", "higher", _EXACT, "preemptions"),
    # KV OOM: refused as longer than max_model_len or the whole cache; memory errors: torch OOM
    Metric("num_kv_oom", "level", "num_cannot_fit", "higher", _EXACT, "requests"),
    Metric("num_memory_errors", "level", "num_oom", "higher", _EXACT, "requests"),
    Metric("output_tokens_per_s", "level", "output_tokens_per_s", "lower", Tolerance(rel=0.5), "tokens/s"),
    Metric("ttft_p95_ms", "level", "ttft_ms.p95", "higher", Tolerance(rel=1.0), "ms"),
    Metric("ttft_p99_ms", "level", "ttft_ms.p99", "higher", Tolerance(rel=1.0), "ms"),
    Metric("tpot_p95_ms", "level", "tpot_ms.p95", "higher", Tolerance(rel=1.0), "ms"),
    Metric("tpot_p99_ms", "level", "tpot_ms.p99", "higher", Tolerance(rel=1.0), "ms"),
    Metric("goodput_rps", "level", "goodput_rps", "lower", Tolerance(rel=0.5), "requests/s"),
)
METRICS_BY_NAME = {m.name: m for m in METRICS}


def check_metric_names(names) -> None:
    """Raises ValueError naming the first name that is not a gated metric."""
    for name in names:
        if name not in METRICS_BY_NAME:
            raise ValueError(f"unknown metric {name!r}; use one of {', '.join(METRICS_BY_NAME)}")


class GateSettings(BaseModel):
    """The ``gate:`` section of a workload: tolerances per metric name, overriding the baseline
    file's, e.g. ``gate: {tolerances: {ttft_p99_ms: {rel: 2.0, abs: 50}}}``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    tolerances: dict[str, Tolerance] = Field(
        {},
        description="A tolerance per gated metric name (``ttft_p99_ms``, ``num_preemptions``, ...), each a"
        " whole tolerance that replaces the baseline file's and the default for that metric.",
    )

    @field_validator("tolerances")
    @classmethod
    def _known_metrics(cls, value: dict[str, Tolerance]) -> dict[str, Tolerance]:
        check_metric_names(value)
        return value
