"""summary.md: the run's tables in Markdown, its charts, and the metric definitions it used."""

from __future__ import annotations

from typing import Any

from kvplan.metrics import DEFINITIONS
from kvplan.report import tables
from kvplan.report.fp8 import fp8_markdown
from kvplan.report.prefix import prefix_markdown

STATUS_NOTES = {
    "complete": "complete",
    "interrupted": "interrupted (Ctrl-C): the tables cover the requests that finished before the stop",
    "running": "incomplete: the run stopped without closing; rebuilt from the records written so far",
}


def _header(results: dict[str, Any]) -> list[str]:
    run, workload = results.get("run", {}), results.get("workload", {})
    status = results.get("status", "running")
    dataset = run.get("dataset") or {}
    lines = [
        f"# kvplan load test: {workload.get('name', '?')}",
        "",
        f"- status: {STATUS_NOTES.get(status, status)}",
        f"- started {results.get('started_at', '?')}, finished {results.get('finished_at') or '-'}",
        f"- workload: `{workload.get('source', '?')}` (sha256 `{workload.get('sha256', '')[:12]}`)",
        f"- engine: {run.get('model', '?')} on {run.get('device', '?')}, dtype {run.get('dtype', '?')},"
        f" KV dtype {run.get('kv_cache_dtype', '?')}, attention backend {run.get('attention_backend', '?')},"
        f" block size {run.get('block_size', '?')}, prefix caching {'on' if run.get('enable_prefix_caching') else 'off'}",
        f"- dataset: {dataset.get('kind', '?')}"
        + (f" ({dataset['num_conversations']:,} whole conversations read)" if "num_conversations" in dataset else ""),
        f"- versions: kvplan {run.get('kvplan_version', '?')}, torch {run.get('torch', '?')},"
        f" transformers {run.get('transformers', '?')}, python {run.get('python', '?')}",
    ]
    slo = (workload.get("config") or {}).get("slo") or {}
    given = [f"{k[:-3].upper()} <= {v:g} ms" for k, v in slo.items() if v is not None]
    lines.append(f"- SLO: {', '.join(given) if given else 'none given (goodput = request throughput)'}")
    return lines


def _exactness(results: dict[str, Any]) -> str:
    kv = results.get("kv") or {}
    steps, error = kv.get("num_steps", 0), kv.get("max_paged_error_bytes", 0)
    if not steps:
        return "No engine step was recorded."
    shared = kv.get("num_shared_steps", 0)
    if shared:  # a shared_prefix run: only the uncached variant's steps can be exact
        verdict = "equal" if error == 0 else f"differ by up to {error:,} B from"
        return (f"Measured KV bytes {verdict} the paged estimate at every one of the uncached variant's"
                f" {steps - shared:,} steps; the cached variant's {shared:,} steps share prefix blocks"
                " (see Prefix caching).")
    if error == 0:
        return f"Measured KV bytes equal the paged estimate at every one of {steps:,} steps (max |difference| 0 B)."
    return (f"Measured KV bytes differ from the paged estimate by up to {error:,} B over {steps:,} steps"
            " (expected with prefix caching on: shared blocks are counted once by the engine).")


def summary_markdown(results: dict[str, Any], charts: list[str]) -> str:
    """The whole summary.md for one run's results.json and the chart files beside it."""
    sections = [
        ("KV pool: kvplan's estimate against the engine", tables.estimate_table(results), ""),
        ("Knee: predicted max concurrency against measured", tables.knee_table(results),
         "Predicted: how many requests of the bucket's P95 length (prompt + output tokens) fit the pool"
         " in whole blocks at once. Measured knee: the lowest concurrency level at which the engine"
         " preempted a request."),
        ("Latency (ms, completed requests)", tables.latency_table(results), ""),
        ("Throughput and goodput", tables.throughput_table(results), ""),
        ("KV cache per level", tables.kv_table(results), _exactness(results)),
        ("Production targets (plan)", tables.plan_table(results),
         "Max concurrency per bucket at its P95 request length, from kvplan's capacity estimate."),
    ]
    lines = _header(results)
    for title, frame, note in sections:
        if title.startswith("Production") and frame.empty:
            continue
        lines += ["", f"## {title}", ""]
        if note:
            lines += [note, ""]
        lines.append(tables.to_markdown(frame).rstrip("\n"))
    lines += fp8_markdown(results)
    lines += prefix_markdown(results)
    lines += ["", "## Charts", ""]
    lines += [f"![{name}]({name})" for name in charts]
    lines += ["", "## Metric definitions", "", DEFINITIONS.rstrip("\n"),
              "- Ideal KV = sum over requests holding KV of resident tokens x kvplan's bytes per token;"
              " paged = whole blocks per request x bytes per block; contiguous = max_model_len per"
              " request (a naive allocator's reservation); measured = used blocks x the engine's real"
              " bytes per block (read from its K/V tensors).", ""]
    return "\n".join(lines)
