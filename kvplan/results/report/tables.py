"""Report tables: the run result -> pandas DataFrames -> Markdown (summary.md) or rich (console).

Every table reads only the saved run result, so ``kvplan report DIR`` and the end of a load
test print the same numbers. Missing values (a level with no completed request, an undefined
TPOT) show as an empty cell, never as 0. A level the run was stopped in is marked ``partial``
and counts its completed requests against the planned ones (the bucket's num_requests).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from kvplan.results import metrics
from kvplan.results.metrics import LatencyStats, LevelSummary
from kvplan.results.run_result import RunResult
from kvplan.results.simulated import SloPoint
from kvplan.results.stats.prefix_metrics import VARIANTS as PREFIX_VARIANTS
from kvplan.results.stats.variants import is_alone

MIB = 2**20


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MIB


def _stat(stats: LatencyStats | None, key: str) -> float | None:
    return None if stats is None else getattr(stats, key)


def level_name(level: LevelSummary) -> str:
    """The level's label (``c=4``, ``2 req/s``, ``c=4 cached``), ``partial`` added for a level
    the run was stopped in."""
    return f"{level.key.label} partial" if level.partial else level.key.label


def _done(level: LevelSummary) -> str:
    """Completed / planned requests (planned: the bucket's num_requests)."""
    planned = level.num_planned
    return f"{level.num_completed}/{planned if planned is not None else level.num_requests}"


def estimate_table(result: RunResult) -> pd.DataFrame:
    """kvplan's prediction of the engine's KV pool against what the engine allocated (a target
    run's: against the server's pool, kvplan.results.report.target.pool_table)."""
    if result.server is not None:
        from kvplan.results.report.target_tables import pool_table

        return pool_table(result)
    est, eng = result.estimate, result.engine
    get = lambda part, name: None if part is None else getattr(part, name)  # noqa: E731
    rows = [
        ("KV bytes per token", get(est, "bytes_per_token"), get(eng, "bytes_per_token")),
        ("KV bytes per block", get(est, "bytes_per_block"), get(eng, "bytes_per_block")),
        ("KV pool blocks", get(est, "num_blocks"), get(eng, "num_blocks")),
        ("KV pool tokens", get(est, "pool_tokens"), get(eng, "pool_tokens")),
        ("KV pool MiB", _mib(get(est, "pool_bytes")), _mib(get(eng, "pool_bytes"))),
    ]
    return pd.DataFrame(rows, columns=["quantity", "estimated (kvplan)", "measured (engine)"])


def knee_table(result: RunResult) -> pd.DataFrame:
    """Per bucket (and engine variant, where the workload has more than one): the estimate's max
    concurrency for its P95 request (the P95 bound), the knee the engine's scheduler shows when
    simulated at every concurrency, and the knee of the levels run (measured in a load test;
    ``none up to c=N`` where no closed-loop level preempted). A target run's says where the server hides it
    (kvplan.results.report.target.knee_table)."""
    if result.server is not None:
        from kvplan.results.report.target_tables import knee_table as target_knee_table

        return target_knee_table(result)
    measured = "measured knee" if result.source == "measured" else f"knee of the {result.source} levels"
    rows = []
    for b in result.buckets:
        # one row per engine variant (kvplan.workload.variants): each engine has a knee of its own
        closed = [
            lv for lv in result.levels if lv.bucket == b.name and lv.mode == "closed" and not is_alone(lv.variant)
        ]
        engines = list(dict.fromkeys(lv.variant for lv in closed if lv.variant not in PREFIX_VARIANTS))
        for engine in engines if len(engines) > 1 else [None]:
            own = closed if engine is None else [lv for lv in closed if lv.variant == engine]
            knee = b.measured_knee if engine is None else metrics.measured_knee(own)
            top = max((int(lv.level) for lv in own if metrics.preemptions(lv) is not None), default=None)
            rows.append(
                {
                    "bucket": b.name if engine is None else f"{b.name} {engine}",
                    "P95 request tokens": b.p95_request_tokens,
                    "predicted max concurrency": b.predicted_max_concurrency,
                    "simulated knee": b.simulated_knee,
                    measured: knee if knee is not None or top is None else f"none up to c={top}",
                    "highest level without preemption": (
                        b.max_clean_concurrency if engine is None else metrics.max_clean_concurrency(own)
                    ),
                }
            )
    return pd.DataFrame(rows)


def _edge(point: SloPoint | None) -> str | None:
    """The level searched just above an answer and its attainment: ``64 (91%)``."""
    return None if point is None else f"{point.level:g} ({point.slo_attainment:.0%})"


def capacity_table(result: RunResult) -> pd.DataFrame:
    """A simulation's searched answers per target and bucket (with what timed its steps: measured
    silicon, the roofline, a calibration): the knee, and the highest
    concurrency and request rate meeting the SLO attainment target with output tok/s and goodput
    there (empty for a run that did not search)."""
    rows = []
    for target in result.capacity:
        on = target.gpu if target.tp == 1 else f"{target.gpu} x{target.tp}"
        for b in target.buckets:
            c, r = b.max_concurrency, b.max_request_rate
            rows.append(
                {
                    "target": target.target,
                    "model": target.model,
                    "GPU": on or "",
                    "step times": target.step_times,
                    "bucket": b.name,
                    "knee": b.knee,
                    f"max c ({target.attainment_target:.0%} in SLO)": c
                    and (f"{int(c.level)} ({b.concurrency_bound})" if b.concurrency_bound else int(c.level)),
                    "out tok/s": c and _round(c.output_tokens_per_s),
                    "goodput": c and _round(c.goodput_rps),
                    "above: c (in SLO)": _edge(b.above_concurrency),
                    "max req/s": "any"
                    if b.burst_meets_slo
                    else r and (f"{r.level:g} ({b.request_rate_bound})" if b.request_rate_bound else r.level),
                    "out tok/s at rate": r and _round(r.output_tokens_per_s),
                    "goodput at rate": r and _round(r.goodput_rps),
                    "above: req/s (in SLO)": _edge(b.above_request_rate),
                }
            )
    return pd.DataFrame(rows)


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.3g}")


def latency_table(result: RunResult) -> pd.DataFrame:
    """TTFT, TPOT, ITL and E2E percentiles (ms) per bucket and level, and each one's mean where a
    bucket runs a benchmark client's protocol (kvplan.workload.protocol: the mean and the median
    both, as that client prints them); TTFO beside TTFT where a target's streams carried
    reasoning."""
    rows = []
    mean = ("mean",) if any(plan.per_concurrency or plan.client for plan in result.level_plans.values()) else ()
    for lv in result.levels:
        row: dict[str, str | float | None] = {"bucket": lv.bucket, "level": level_name(lv), "done/planned": _done(lv)}
        for metric, keys in (
            ("ttft_ms", (*mean, "p50", "p95", "p99")),
            ("tpot_ms", (*mean, "p50", "p95", "p99")),
            ("itl_ms", (*mean, "p50", "p99")),
            ("e2e_ms", (*mean, "p50", "p99")),
        ):
            for key in keys:
                label = "mean" if key == "mean" else key.upper()
                row[f"{metric[:-3].upper()} {label} ms"] = _stat(getattr(lv, metric), key)
        rows.append(row)
    if any(lv.ttfo_ms is not None for lv in result.levels):  # streams that carried reasoning
        at = list(rows[0]).index("TTFT P99 ms") + 1 if rows else 0
        for row, lv in zip(rows, result.levels):
            items = list(row.items())
            ttfo = [(f"TTFO {k.upper()} ms", _stat(lv.ttfo_ms, k)) for k in ("p50", "p95", "p99")]
            row.clear()
            row.update(items[:at] + ttfo + items[at:])
    return pd.DataFrame(rows)


def _arrival_cv(level: LevelSummary) -> str | None:
    """An open-loop level's achieved inter-arrival CV beside the one asked for, ``0.51 (0.50)``
    (``- (0.50)`` with too few arrivals to tell); None for a closed-loop level."""
    if level.requested_cv is None:
        return None
    achieved = "-" if level.achieved_cv is None else f"{level.achieved_cv:.2f}"
    return f"{achieved} ({level.requested_cv:.2f})"


def throughput_table(result: RunResult) -> pd.DataFrame:
    """Throughput and goodput per bucket and level, and for open-loop levels the inter-arrival
    CV achieved (asked for) (kvplan.results.stats.arrival_stats); a run with no open-loop level, or
    summarized by a kvplan before the CVs, shows no such column."""
    rows = [
        {
            "bucket": lv.bucket,
            "level": level_name(lv),
            "output tok/s": lv.output_tokens_per_s,
            "total tok/s": lv.total_tokens_per_s,
            "req/s": lv.requests_per_s,
            "goodput req/s": lv.goodput_rps,
            "SLO attainment": lv.slo_attainment,
            "failed": lv.num_failed,
        }
        for lv in result.levels
    ]
    if any(lv.requested_cv is not None for lv in result.levels):
        for row, lv in zip(rows, result.levels):
            row["arrival CV (asked)"] = _arrival_cv(lv)
    return pd.DataFrame(rows)


def steady_table(result: RunResult) -> pd.DataFrame:
    """Steady-state levels: requests measured and excluded (warm-up, cool-down) and the measured
    window in seconds from the level's first arrival; empty when every level is plain."""
    rows = [
        {
            "bucket": lv.bucket,
            "level": level_name(lv),
            "measured": lv.num_requests,
            "excluded": lv.num_excluded,
            "window from s": _round(lv.window_start_s),
            "window to s": _round(lv.window_end_s),
        }
        for lv in result.levels
        if lv.num_excluded or lv.window_start_s is not None
    ]
    return pd.DataFrame(rows)


def kv_table(result: RunResult) -> pd.DataFrame:
    """KV cache per level: blocks, usage, preemptions, KV OOM, queue, and the four KV sizes."""
    rows = [
        {
            "bucket": lv.bucket,
            "level": level_name(lv),
            "blocks": lv.num_total_blocks,
            "peak used": lv.peak_used_blocks,
            "mean usage": lv.mean_kv_usage,
            "preemptions": lv.num_preemptions,
            "KV OOM": lv.num_cannot_fit,
            "mem errors": lv.num_oom,
            "queue mean": lv.mean_queue_len,
            "queue max": lv.max_queue_len,
            "peak ideal MiB": _mib(lv.peak_ideal_bytes),
            "peak paged MiB": _mib(lv.peak_paged_bytes),
            "peak measured MiB": _mib(lv.peak_measured_bytes),
            "peak contiguous MiB": _mib(lv.peak_contiguous_bytes),
            "max abs(measured - paged) B": lv.max_paged_error_bytes,
            "prefix hit rate": lv.prefix_hit_rate,
        }
        for lv in result.levels
    ]
    return pd.DataFrame(rows)


def plan_table(result: RunResult) -> pd.DataFrame:
    """Per production target (plan:) and bucket: the max concurrency the estimate gives there."""
    rows = []
    for target in result.estimate.plan if result.estimate else []:
        row = {
            "target": f"{target.model} on {target.gpu} tp={target.tp} kv={target.kv_cache_dtype}"
            + (f" weights={target.weight_dtype}" if target.weight_dtype != "auto" else ""),
            "KV bytes/token": target.bytes_per_token,
            "KV tokens": target.kv_capacity_tokens,
        }
        for b in target.buckets:
            row[f"{b.name} max concurrency"] = b.max_concurrency
        rows.append(row)
    return pd.DataFrame(rows)


def console_table(result: RunResult) -> pd.DataFrame:
    """One narrow row per level for an 80-column terminal; summary.md has the full tables."""
    rows = [
        {
            "bucket": lv.bucket,
            "level": level_name(lv),
            "done": _done(lv),
            "TTFT p50": _stat(lv.ttft_ms, "p50"),
            "TTFT p99": _stat(lv.ttft_ms, "p99"),
            "TPOT p50": _stat(lv.tpot_ms, "p50"),
            "TPOT p99": _stat(lv.tpot_ms, "p99"),
            "out tok/s": lv.output_tokens_per_s,
            "goodput": lv.goodput_rps,
            "preempt": "unavailable" if (n := metrics.preemptions(lv)) is None and result.server else n,
            "peak blocks": (
                f"{lv.peak_used_blocks}/{lv.num_total_blocks}"
                if lv.num_steps
                else "server "
                + (f"{lv.server_peak_kv_usage:.0%}" if lv.server_peak_kv_usage is not None else "unavailable")
                if result.server
                else "not recorded"  # a disaggregated engine's two pools (no steps recorded)
            ),
        }
        for lv in result.levels
    ]
    return pd.DataFrame(rows)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        if value == int(value) and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table (pandas' own to_markdown needs the tabulate package)."""
    if frame.empty:
        return "_no data_\n"
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.astype(object).itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def to_rich(frame: pd.DataFrame, title: str):
    """The same table for the console."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in frame.columns:
        numeric = pd.api.types.is_numeric_dtype(frame[column])
        table.add_column(str(column), justify="right" if numeric else "left")
    for row in frame.astype(object).itertuples(index=False):
        table.add_row(*(_cell(v) for v in row))
    return table
