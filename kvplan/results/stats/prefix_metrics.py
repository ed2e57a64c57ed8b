"""Prefix caching in a load test: pure functions of the saved records and summaries.

A ``shared_prefix`` workload runs every load level twice on one engine (kvplan.run.driver), on the
same prompts, so TTFT with and without prefix reuse is measured side by side in one run::

    variant    cache salt of request i of a level    what the prefix cache can do
    cached     <level>/tenant<t>                     share a group's prefix blocks within tenant t
    uncached   <level>/<i>   (one per request)       nothing: every block hash differs

The estimate with the prefix counted once is kvplan's paged estimate (whole blocks per request)
minus, for every (prefix group, cache salt) with k requests holding the prefix's full blocks,
(k - 1) x the bytes of those blocks: k requests hold one copy, as
``kvplan.sizing.kv_math.batch_kv_bytes`` counts a batch sharing a prefix. It is the ideal: the engine
shares a block only when it was cached before the request was admitted, so requests of one group
admitted in the same step each compute (and hold) their own copy, and the measured KV then lies
between this estimate and the paged one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from pydantic import BaseModel, ConfigDict

from kvplan.results.metrics import LatencyStats, LevelSummary
from kvplan.results.records import LevelKey, Mode, RequestRecord, StepRecord

CACHED, UNCACHED = "cached", "uncached"
VARIANTS = (CACHED, UNCACHED)  # the order a level's variants run in


@dataclass(frozen=True)
class PrefixPricing:
    """What sharing the prefix saves. ``full_tokens``: tokens in the prefix's full blocks
    (num_tokens // block_size x block_size); ``shared_bytes``: their KV bytes, from
    ``kvplan.sizing.kv_math.shared_prefix_bytes`` (saved in the run result's ``estimate.shared_prefix``)."""

    full_tokens: int
    shared_bytes: int


def hit_rate(hit_tokens: int, queried_tokens: int) -> float | None:
    """Prefix cache hit rate: prompt tokens found cached / prompt tokens looked up (None: none)."""
    return hit_tokens / queried_tokens if queried_tokens else None


def residents(step: StepRecord, requests_by_id: Mapping[str, RequestRecord]) -> list[RequestRecord] | None:
    """The records of the requests holding KV after ``step``, in the order of its
    ``kv_resident_tokens`` (the engine names them in ``kv_resident_request_ids``). None when one
    has no record (a request still running when the run stopped) or the step names no requests
    (records written before the engine reported them)."""
    if len(step.kv_resident_request_ids) != len(step.kv_resident_tokens):
        return None
    held = [requests_by_id.get(rid) for rid in step.kv_resident_request_ids]
    found = [r for r in held if r is not None]
    return found if len(found) == len(held) else None


def shared_prefix_estimate_bytes(
    step: StepRecord,
    held: Sequence[RequestRecord],
    pricing: PrefixPricing,
) -> int:
    """The step's paged estimate with the prefix's full blocks counted once per (prefix group,
    cache salt) in flight. ``held``: ``residents(step, ...)``, in the order of
    ``step.kv_resident_tokens``; a request counts as holding the prefix once its resident tokens
    cover the prefix's full blocks."""
    sharers = Counter(
        (r.prefix_group, r.cache_salt)
        for r, tokens in zip(held, step.kv_resident_tokens)
        if r.prefix_group is not None and tokens >= pricing.full_tokens
    )
    return step.paged_bytes - sum(k - 1 for k in sharers.values()) * pricing.shared_bytes


def step_estimates(
    steps: Sequence[StepRecord],
    requests: Sequence[RequestRecord],
    pricing: PrefixPricing | None,
) -> list[int | None]:
    """``shared_prefix_estimate_bytes`` for every step (None where ``residents`` cannot tell, and
    for every step of a run without a shared prefix)."""
    if pricing is None:
        return [None] * len(steps)
    by_id = {r.request_id: r for r in requests}
    out: list[int | None] = []
    for s in steps:
        held = residents(s, by_id)
        out.append(None if held is None else shared_prefix_estimate_bytes(s, held, pricing))
    return out


class PrefixComparison(BaseModel):
    """One level run in both variants: prefix hit rate, TTFT P50/P95 (ms) and KV (bytes) with
    caching effective (``cached``) and defeated (``uncached``); see ``compare_variants``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    bucket: str
    mode: str
    level: int | float
    prefix_hit_rate_cached: float | None
    prefix_hit_rate_uncached: float | None
    ttft_p50_ms_cached: float | None
    ttft_p50_ms_uncached: float | None
    ttft_p95_ms_cached: float | None
    ttft_p95_ms_uncached: float | None
    ttft_p50_speedup: float | None
    peak_paged_bytes: int
    peak_shared_estimate_bytes: int | None
    peak_measured_bytes_cached: int
    peak_measured_bytes_uncached: int | None
    mean_paged_bytes: float | None = None
    mean_shared_estimate_bytes: float | None = None
    mean_measured_bytes_cached: float | None = None
    mean_measured_bytes_uncached: float | None = None
    num_steps_estimated: int = 0
    num_steps: int = 0

    @property
    def key(self) -> LevelKey:
        """The level run in both variants (no variant in the key: its label is the table's row)."""
        # mode: a LevelKey's own, saved as its string (closed or open)
        return LevelKey(self.bucket, cast(Mode, self.mode), self.level)


def _p(stats: LatencyStats | None, key: str) -> float | None:
    return None if stats is None else getattr(stats, key)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def compare_variants(
    levels: Sequence[LevelSummary],
    steps: Sequence[StepRecord],
    estimates: Sequence[int | None],
) -> list[PrefixComparison]:
    """Per level run in both variants: prefix hit rate, TTFT P50/P95 (ms) and KV bytes with
    caching effective and with it defeated. KV: peaks over each variant's steps; for the cached
    variant also the estimate with the prefix counted once, and means (per step) of it, the paged
    estimate and the measured bytes over the steps where it could be told.

    ``estimates``: ``step_estimates``, one per step.
    """
    by_key = {lv.key: lv for lv in levels}
    rows = []
    for key, cached in by_key.items():
        if key.variant != CACHED:
            continue
        twin = LevelKey(key.bucket, key.mode, key.value, UNCACHED)
        uncached = by_key.get(twin)
        told = [(s, e) for s, e in zip(steps, estimates) if e is not None and s.key == key]
        uncached_steps = [s for s in steps if s.key == twin]
        p50_cached, p50_uncached = _p(cached.ttft_ms, "p50"), _p(uncached.ttft_ms if uncached else None, "p50")
        rows.append(
            PrefixComparison(
                bucket=key.bucket,
                mode=key.mode,
                level=key.value,
                prefix_hit_rate_cached=cached.prefix_hit_rate,
                prefix_hit_rate_uncached=uncached.prefix_hit_rate if uncached else None,
                ttft_p50_ms_cached=p50_cached,
                ttft_p50_ms_uncached=p50_uncached,
                ttft_p95_ms_cached=_p(cached.ttft_ms, "p95"),
                ttft_p95_ms_uncached=_p(uncached.ttft_ms if uncached else None, "p95"),
                ttft_p50_speedup=(
                    p50_uncached / p50_cached
                    if p50_cached is not None and p50_uncached is not None and p50_cached > 0
                    else None
                ),
                peak_paged_bytes=cached.peak_paged_bytes,
                peak_shared_estimate_bytes=max((e for _, e in told), default=None),
                peak_measured_bytes_cached=cached.peak_measured_bytes,
                peak_measured_bytes_uncached=uncached.peak_measured_bytes if uncached else None,
                mean_paged_bytes=_mean([s.paged_bytes for s, _ in told]),
                mean_shared_estimate_bytes=_mean([e for _, e in told]),
                mean_measured_bytes_cached=_mean([s.measured_bytes for s, _ in told]),
                mean_measured_bytes_uncached=_mean([s.measured_bytes for s in uncached_steps]),
                num_steps_estimated=len(told),
                num_steps=cached.num_steps,
            )
        )
    return rows
