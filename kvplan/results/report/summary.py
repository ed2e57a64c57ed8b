"""summary.md: the run's tables in Markdown, its charts, and the metric definitions it used."""

from __future__ import annotations

from kvplan.results.metrics import DEFINITIONS, TARGET_DEFINITIONS
from kvplan.results.report import tables
from kvplan.results.report.admission import admission_markdown
from kvplan.results.report.fp8 import fp8_markdown
from kvplan.results.report.prefix import offload_markdown, prefix_markdown
from kvplan.results.report.target import target_knee_note, target_lines, target_markdown
from kvplan.results.report.traffic import traffic_markdown
from kvplan.results.report.turns import turns_markdown
from kvplan.results.run_result import RunResult

STATUS_NOTES = {
    "complete": "complete",
    "interrupted": "interrupted (Ctrl-C): the tables cover the requests that finished before the stop",
    "running": "incomplete: the run stopped without closing; rebuilt from the records written so far",
}


def _header(result: RunResult) -> list[str]:
    run, workload, eng = result.run, result.workload, result.engine
    dataset = run.dataset
    lines = [
        f"# kvplan load test: {workload.name}" + (" (remote target)" if result.server else ""),
        "",
        f"- status: {STATUS_NOTES.get(result.status, result.status)}",
        f"- started {result.started_at}, finished {result.finished_at or '-'}",
        f"- workload: `{workload.source}` (sha256 `{workload.sha256[:12]}`)",
    ]
    if eng is not None:
        lines.append(
            f"- engine: {eng.model} on {eng.device}, dtype {eng.dtype}, KV dtype {eng.kv_cache_dtype},"
            f" attention backend {eng.attention_backend}, block size {eng.block_size},"
            f" prefix caching {'on' if eng.enable_prefix_caching else 'off'}"
        )
    lines += target_lines(result)
    lines += [
        f"- dataset: {dataset.get('kind', '?')}"
        + (f" ({dataset['num_conversations']:,} whole conversations read)" if "num_conversations" in dataset else ""),
        f"- versions: kvplan {run.kvplan_version}, torch {run.torch or '-'},"
        f" transformers {run.transformers or '-'}, python {run.python}",
    ]
    given = [f"{k[:-3].upper()} <= {v:g} ms" for k, v in result.slo.model_dump().items() if v is not None]
    lines.append(f"- SLO: {', '.join(given) if given else 'none given (goodput = request throughput)'}")
    return lines


def _exactness(result: RunResult) -> str:
    kv = result.kv
    if kv is None or not kv.num_steps:
        return "No engine step was recorded."
    steps, error = kv.num_steps, kv.max_paged_error_bytes
    shared = kv.num_shared_steps or 0
    if shared:  # a shared_prefix run: only the uncached variant's steps can be exact
        verdict = "equal" if error == 0 else f"differ by up to {error:,} B from"
        return (
            f"Measured KV bytes {verdict} the paged estimate at every one of the uncached variant's"
            f" {steps - shared:,} steps; the cached variant's {shared:,} steps share prefix blocks"
            " (see Prefix caching)."
        )
    if error == 0:
        return f"Measured KV bytes equal the paged estimate at every one of {steps:,} steps (max |difference| 0 B)."
    return (
        f"Measured KV bytes differ from the paged estimate by up to {error:,} B over {steps:,} steps"
        " (expected with prefix caching on: shared blocks are counted once by the engine)."
    )


def _simulation(result: RunResult) -> str:
    """How a simulation timed its steps, and what the capacity search means."""
    cost = result.cost_model
    if cost is None:
        return ""
    source = f" ({cost.source})" if cost.source else ""
    return (
        f"Steps timed by a {cost.kind} cost model: {cost.description}{source}. Knee: the lowest concurrency"
        " that preempts. Max concurrency and max req/s: the highest closed-loop concurrency and Poisson request"
        " rate at which the attainment target of requests meet every SLO, with output tokens/s and goodput"
        " (req/s) there."
    )


def summary_markdown(result: RunResult, charts: list[str]) -> str:
    """The whole summary.md for one run's result and the chart files beside it."""
    sections = [
        (
            f"KV pool: kvplan's estimate against the {'server' if result.server else 'engine'}",
            tables.estimate_table(result),
            "",
        ),
        (
            "Knee: predicted max concurrency against measured",
            tables.knee_table(result),
            target_knee_note(result)
            or "Predicted: how many requests of the bucket's P95 length (prompt + output tokens) fit the pool"
            " in whole blocks at once. Simulated knee: the lowest concurrency at which the engine's own"
            " scheduler, replayed on the bucket's requests at every concurrency, preempts. Measured knee:"
            " the lowest concurrency level at which the engine preempted a request.",
        ),
        ("Capacity within the SLO (simulated)", tables.capacity_table(result), _simulation(result)),
        (
            "Steady state: measured requests and window",
            tables.steady_table(result),
            "Warm-up and cool-down requests are kept out of every statistic below; the window runs from"
            " the first measured arrival to the last measured finish, in seconds from the level's start.",
        ),
        ("Latency (ms, completed requests)", tables.latency_table(result), ""),
        ("Throughput and goodput", tables.throughput_table(result), ""),
        ("KV cache per level", tables.kv_table(result), _exactness(result)),
        (
            "Production targets (plan)",
            tables.plan_table(result),
            "Max concurrency per bucket at its P95 request length, from kvplan's capacity estimate.",
        ),
    ]
    lines = _header(result)
    for title, frame, note in sections:
        if title.startswith(("Production", "Capacity", "Steady")) and frame.empty:
            continue
        if result.server is not None and title.startswith("KV cache"):  # engine steps only: see Server
            continue
        lines += ["", f"## {title}", ""]
        if note:
            lines += [note, ""]
        lines.append(tables.to_markdown(frame).rstrip("\n"))
    lines += target_markdown(result)
    lines += fp8_markdown(result)
    lines += prefix_markdown(result)
    lines += offload_markdown(result)
    lines += turns_markdown(result)
    lines += traffic_markdown(result)
    lines += admission_markdown(result)
    lines += ["", "## Charts", ""]
    lines += [f"![{name}]({name})" for name in charts] or ["Not drawn: `kvplan report DIR` draws them."]
    definitions = DEFINITIONS + (TARGET_DEFINITIONS if result.server is not None else "")
    lines += [
        "",
        "## Metric definitions",
        "",
        definitions.rstrip("\n"),
        "- Ideal KV = sum over requests holding KV of resident tokens x kvplan's bytes per token;"
        " paged = whole blocks per request x bytes per block; contiguous = max_model_len per"
        " request (a naive allocator's reservation); measured = used blocks x the engine's real"
        " bytes per block (read from its K/V tensors).",
        "",
    ]
    return "\n".join(lines)
