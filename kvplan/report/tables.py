"""Report tables: results.json -> pandas DataFrames -> Markdown (summary.md) or rich (console).

Every table reads only the saved result dict, so ``kvplan report DIR`` and the end of a load
test print the same numbers. Missing values (a level with no completed request, an undefined
TPOT) show as an empty cell, never as 0. A level the run was stopped in is marked ``partial``
and counts its completed requests against the planned ones (the bucket's num_requests).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

MIB = 2**20


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MIB


def _stat(level: dict[str, Any], metric: str, key: str) -> float | None:
    stats = level.get(metric)
    return None if stats is None else stats[key]


def _level_name(level: dict[str, Any]) -> str:
    """``c=4``, ``2/s``; ``c=4 cached`` in a shared_prefix run; ``c=8 partial`` for a level the
    run was stopped in."""
    name = f"c={int(level['level'])}" if level["mode"] == "closed" else f"{level['level']:g}/s"
    name = f"{name} {level.get('variant', '')}".rstrip()
    return f"{name} partial" if level.get("partial") else name


def _done(level: dict[str, Any]) -> str:
    """Completed / planned requests (planned: the bucket's num_requests; older results: run)."""
    planned = level.get("num_planned")
    return f"{level['num_completed']}/{planned if planned is not None else level['num_requests']}"


def estimate_table(results: dict[str, Any]) -> pd.DataFrame:
    """kvplan's prediction of the engine's KV pool against what the engine allocated."""
    est, run = results.get("estimate", {}), results.get("run", {})
    rows = [
        ("KV bytes per token", est.get("bytes_per_token"), run.get("bytes_per_token")),
        ("KV bytes per block", est.get("bytes_per_block"), run.get("bytes_per_block")),
        ("KV pool blocks", est.get("num_blocks"), run.get("num_blocks")),
        ("KV pool tokens", est.get("pool_tokens"), run.get("pool_tokens")),
        ("KV pool MiB", _mib(est.get("pool_bytes")), _mib(run.get("pool_bytes"))),
    ]
    return pd.DataFrame(rows, columns=["quantity", "estimated (kvplan)", "measured (engine)"])


def knee_table(results: dict[str, Any]) -> pd.DataFrame:
    """Per bucket: the estimate's max concurrency for its P95 request against the measured knee."""
    rows = [
        {
            "bucket": b["name"],
            "P95 request tokens": b.get("p95_request_tokens"),
            "predicted max concurrency": b.get("predicted_max_concurrency"),
            "measured knee": b.get("measured_knee"),
            "highest level without preemption": b.get("max_clean_concurrency"),
        }
        for b in results.get("buckets", [])
    ]
    return pd.DataFrame(rows)


def latency_table(results: dict[str, Any]) -> pd.DataFrame:
    """TTFT, TPOT, ITL and E2E percentiles (ms) per bucket and level."""
    rows = []
    for lv in results.get("levels", []):
        row = {"bucket": lv["bucket"], "level": _level_name(lv), "done/planned": _done(lv)}
        for metric, keys in (("ttft_ms", ("p50", "p95", "p99")), ("tpot_ms", ("p50", "p95", "p99")),
                             ("itl_ms", ("p50", "p99")), ("e2e_ms", ("p50", "p99"))):
            for key in keys:
                row[f"{metric[:-3].upper()} {key.upper()} ms"] = _stat(lv, metric, key)
        rows.append(row)
    return pd.DataFrame(rows)


def throughput_table(results: dict[str, Any]) -> pd.DataFrame:
    """Throughput and goodput per bucket and level."""
    rows = [
        {
            "bucket": lv["bucket"], "level": _level_name(lv),
            "output tok/s": lv["output_tokens_per_s"], "total tok/s": lv["total_tokens_per_s"],
            "req/s": lv["requests_per_s"], "goodput req/s": lv["goodput_rps"],
            "SLO attainment": lv["slo_attainment"], "failed": lv["num_failed"],
        }
        for lv in results.get("levels", [])
    ]
    return pd.DataFrame(rows)


def kv_table(results: dict[str, Any]) -> pd.DataFrame:
    """KV cache per level: blocks, usage, preemptions, KV OOM, queue, and the four KV sizes."""
    rows = [
        {
            "bucket": lv["bucket"], "level": _level_name(lv),
            "blocks": lv["num_total_blocks"], "peak used": lv["peak_used_blocks"],
            "mean usage": lv["mean_kv_usage"], "preemptions": lv["num_preemptions"],
            "KV OOM": lv["num_cannot_fit"], "mem errors": lv["num_oom"],
            "queue mean": lv["mean_queue_len"], "queue max": lv["max_queue_len"],
            "peak ideal MiB": _mib(lv["peak_ideal_bytes"]), "peak paged MiB": _mib(lv["peak_paged_bytes"]),
            "peak measured MiB": _mib(lv["peak_measured_bytes"]),
            "peak contiguous MiB": _mib(lv["peak_contiguous_bytes"]),
            "max abs(measured - paged) B": lv["max_paged_error_bytes"],
            "prefix hit rate": lv["prefix_hit_rate"],
        }
        for lv in results.get("levels", [])
    ]
    return pd.DataFrame(rows)


def plan_table(results: dict[str, Any]) -> pd.DataFrame:
    """Per production target (plan:) and bucket: the max concurrency the estimate gives there."""
    rows = []
    for target in results.get("estimate", {}).get("plan", []):
        row = {
            "target": f"{target['model']} on {target['gpu']} tp={target['tp']} kv={target['kv_dtype']}",
            "KV bytes/token": target.get("bytes_per_token"),
            "KV tokens": target.get("kv_capacity_tokens"),
        }
        for b in target.get("buckets", []):
            row[f"{b['name']} max concurrency"] = b.get("max_concurrency")
        rows.append(row)
    return pd.DataFrame(rows)


def console_table(results: dict[str, Any]) -> pd.DataFrame:
    """One narrow row per level for an 80-column terminal; summary.md has the full tables."""
    rows = [
        {
            "bucket": lv["bucket"], "level": _level_name(lv), "done": _done(lv),
            "TTFT p50": _stat(lv, "ttft_ms", "p50"), "TTFT p99": _stat(lv, "ttft_ms", "p99"),
            "TPOT p50": _stat(lv, "tpot_ms", "p50"), "TPOT p99": _stat(lv, "tpot_ms", "p99"),
            "out tok/s": lv["output_tokens_per_s"], "goodput": lv["goodput_rps"],
            "preempt": lv["num_preemptions"], "peak blocks": f"{lv['peak_used_blocks']}/{lv['num_total_blocks']}",
        }
        for lv in results.get("levels", [])
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
