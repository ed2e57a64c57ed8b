"""The run result's summaries: a pure function of its records, its estimate and its SLO.

``summarize`` fills ``levels`` (one LevelSummary per bucket x level x variant), ``buckets``
(predicted max concurrency vs measured knee), ``kv`` (paging exactness over the steps where no
block could be shared: all but a shared_prefix run's cached variant) and, for a shared_prefix
run, ``prefix_caching`` (kvplan.results.stats.prefix_metrics.compare_variants).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import sub

from kvplan.results import metrics
from kvplan.results.records import LevelKey, RequestRecord, StepRecord
from kvplan.results.rows import column
from kvplan.results.run_result import BucketSummary, KvSummary, RunResult
from kvplan.results.stats import prefix_metrics
from kvplan.results.stats.arrival_stats import bucket_arrivals
from kvplan.results.stats.server_samples import ServerSample, level_server_stats
from kvplan.results.stats.variants import is_alone


def prefix_pricing(result: RunResult) -> prefix_metrics.PrefixPricing | None:
    """What sharing the run's prefix saves (None for a run without a shared prefix)."""
    estimate = result.estimate
    shared = estimate.shared_prefix if estimate else None
    if estimate is None or shared is None:
        return None
    return prefix_metrics.PrefixPricing(shared.num_full_blocks * estimate.block_size, shared.shared_bytes_per_request)


def shared_step_estimates(
    result: RunResult, requests: Sequence[RequestRecord], steps: Sequence[StepRecord]
) -> list[int | None]:
    """Per step, the paged estimate with the shared prefix counted once (None where it cannot be
    told, and everywhere in a run without a shared prefix)."""
    return prefix_metrics.step_estimates(steps, requests, prefix_pricing(result))


def with_server_stats(
    levels: list[metrics.LevelSummary], samples: Sequence[ServerSample], requests: Sequence[RequestRecord] = ()
) -> list[metrics.LevelSummary]:
    """Each level with its server-side preemptions, KV usage, output tokens and prefix-cache hit rate
    from a target's /metrics reads; a steady-state level's over its measured window only (its
    ``window_start_s``/``window_end_s`` from its first arrival in ``requests``)."""
    first: dict[LevelKey, float] = {}
    for r in requests:
        key = LevelKey.of(r)
        first[key] = min(first.get(key, r.arrival_time), r.arrival_time)
    windows = {
        lv.key: (first[lv.key] + lv.window_start_s, first[lv.key] + lv.window_end_s)
        for lv in levels
        if lv.window_start_s is not None and lv.window_end_s is not None and lv.key in first
    }
    stats = level_server_stats(samples, windows)
    out = []
    for level in levels:
        s = stats.get(level.key)
        out.append(
            level
            if s is None
            else level.model_copy(
                update={
                    "server_preemptions": s.preemptions,
                    "server_peak_kv_usage": s.peak_kv_usage,
                    "server_mean_kv_usage": s.mean_kv_usage,
                    "server_output_tokens": s.generation_tokens,
                    "server_prefix_hit_rate": s.prefix_hit_rate,
                }
            )
        )
    return out


def in_class_order(levels: list[metrics.LevelSummary], result: RunResult) -> list[metrics.LevelSummary]:
    """Each mixed level's classes in the order its bucket's ``mix`` lists them (the workload kept
    in the run result), not the order their first requests happened to finish in."""
    order = {
        b.get("name"): [c.get("name") for c in b.get("mix") or []]
        for b in result.workload.config.get("buckets", [])
        if isinstance(b, dict)
    }
    out = []
    for level in levels:
        names = order.get(level.bucket) or []
        rank = {name: i for i, name in enumerate(names)}
        ordered = sorted(level.classes, key=lambda c: rank.get(c.name, len(names)))
        out.append(level if ordered == level.classes else level.model_copy(update={"classes": ordered}))
    return out


def summarize(
    result: RunResult,
    requests: Sequence[RequestRecord],
    steps: Sequence[StepRecord],
    server_samples: Sequence[ServerSample] = (),
) -> RunResult:
    """``result`` with its summaries computed from ``requests``, ``steps`` and, for a remote
    target, its /metrics reads (``server_samples``)."""
    levels = metrics.summarize_levels(
        requests,
        steps,
        result.slo,
        result.planned_requests(),
        result.level_plans,
        result.class_slos,
        arrivals=bucket_arrivals(result.workload.config),
    )
    levels = with_server_stats(levels, server_samples, requests)
    levels = in_class_order(levels, result)
    estimates = {b.name: b for b in (result.estimate.buckets if result.estimate else [])}
    names = list(dict.fromkeys([*estimates, *(s.bucket for s in levels)]))
    buckets = []
    for name in names:
        # The predicted max concurrency shares nothing, so the knee is the unshared variant's; with
        # engine variants, the first variant's (classes alone are not the bucket's load).
        mine = [
            s for s in levels if s.bucket == name and s.variant != prefix_metrics.CACHED and not is_alone(s.variant)
        ]
        own = [s for s in mine if s.variant == mine[0].variant]
        estimate = estimates.get(name)
        buckets.append(
            BucketSummary(
                name=name,
                p95_request_tokens=estimate.p95_request_tokens if estimate else None,
                predicted_max_concurrency=estimate.max_concurrency if estimate else None,
                simulated_knee=estimate.simulated_knee if estimate else None,
                measured_knee=metrics.measured_knee(own),
                max_clean_concurrency=metrics.max_clean_concurrency(own),
                levels_run=[s.level for s in own],
            )
        )
    # |measured - paged| of each step of an unshared variant, read column by column
    variants, measured, paged = column(steps, "variant"), column(steps, "measured_bytes"), column(steps, "paged_bytes")
    if variants and variants.count(variants[0]) == len(variants):  # one variant (a run without one: every step)
        unshared = [] if variants[0] == prefix_metrics.CACHED else list(map(abs, map(sub, measured, paged)))
    else:
        unshared = [abs(m - p) for v, m, p in zip(variants, measured, paged) if v != prefix_metrics.CACHED]
    pricing = prefix_pricing(result)
    kv = KvSummary(
        num_steps=len(steps),
        max_paged_error_bytes=max(unshared, default=0),
        num_requests=len(requests),
        num_shared_steps=len(steps) - len(unshared) if pricing is not None else None,
    )
    prefix_caching = None
    if pricing is not None:
        per_step = prefix_metrics.step_estimates(steps, requests, pricing)
        prefix_caching = prefix_metrics.compare_variants(levels, steps, per_step)
    return result.model_copy(update={"levels": levels, "buckets": buckets, "kv": kv, "prefix_caching": prefix_caching})
