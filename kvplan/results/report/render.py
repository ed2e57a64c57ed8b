"""Render a run folder's views (summary.md, CSV tables, PNG charts) from its saved result.

``render_report`` is what both ``kvplan loadtest`` (at the end) and ``kvplan report DIR`` call,
so re-rendering never re-runs anything. If results.json has no summaries (the run was killed
before it could write them), they are rebuilt from the JSONL records and saved first. Records
that are missing or fewer than results.json counts stop it before it writes anything
(kvplan.results.run_result.check_records); when every view is written, results.json gets
``report_written: true``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from kvplan.results.run_result import RunData, RunResult, check_records, load_run, save_result
from kvplan.results.store import write_atomic
from kvplan.results.summarize import shared_step_estimates, summarize


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _figure(width: float, height: float, ncols: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


def render_charts(data: RunData) -> list[str]:
    """Write the PNGs into the run folder; returns their file names in display order."""
    from kvplan.results.report import plots

    result, out = data.result, data.run_dir
    levels = result.levels
    knees = {b.name: b for b in result.buckets}
    names: list[str] = []

    shared = shared_step_estimates(result, data.requests, data.steps)
    fig, (ax,) = _figure(11, 5)
    if result.server is not None:  # a target: no engine steps; the server's own usage gauge instead
        from kvplan.results.report.target import plot_server_kv

        plot_server_kv(ax, data.server_samples, result.server)
    else:
        plots.plot_kv_over_time(ax, data.steps, result.engine.pool_bytes if result.engine else None, shared)
    _save(fig, out / "kv_over_time.png")
    names.append("kv_over_time.png")
    if result.prefix_caching is not None:
        names += render_prefix_charts(data)
    if any(lv.offload is not None for lv in levels):  # KV offload tiers (engine.offload)
        from kvplan.results.report.prefix import plot_hits_by_tier

        fig, (ax,) = _figure(9, 4.5)
        plot_hits_by_tier(ax, levels)
        _save(fig, out / "offload_hits_by_tier.png")
        names.append("offload_hits_by_tier.png")
    from kvplan.results.report import traffic

    if traffic.has_interference(levels):
        fig, (ax,) = _figure(11, 4.5)
        traffic.plot_interference(ax, traffic.interference(levels))
        _save(fig, out / "interference.png")
        names.append("interference.png")

    for bucket in knees or ["(none)"]:
        for mode, suffix in (("closed", ""), ("open", "_open")):
            own = [lv for lv in levels if lv.bucket == bucket and lv.mode == mode]
            if mode == "open" and not own:
                continue
            fig, axes = _figure(14, 4.2, 3)
            for ax, metric in zip(axes, ("ttft_ms", "tpot_ms", "e2e_ms")):
                plots.plot_latency_vs_level(ax, own, metric, knees.get(bucket) if mode == "closed" else None)
            fig.suptitle(f"bucket {bucket}: latency vs {'concurrency' if mode == 'closed' else 'request rate'}")
            name = f"latency_{re.sub(r'[^A-Za-z0-9_.-]', '_', bucket)}{suffix}.png"
            _save(fig, out / name)
            names.append(name)

    fig, axes = _figure(12, 4.5, 2)
    plots.plot_throughput(axes[0], levels)
    plots.plot_goodput(axes[1], levels)
    _save(fig, out / "throughput_goodput.png")
    names.append("throughput_goodput.png")

    if result.server is not None:  # engine steps only: a target run has none to draw
        return names
    fig, axes = _figure(12, 4.8, 2)
    plots.plot_estimate_vs_measured(axes[0], data.steps, shared)
    plots.plot_peak_kv_per_level(axes[1], levels)
    _save(fig, out / "kv_estimate_vs_measured.png")
    names.append("kv_estimate_vs_measured.png")
    return names


def render_prefix_charts(data: RunData) -> list[str]:
    """A shared_prefix run's two charts: TTFT and peak KV with vs without caching per level,
    and the prefix hit rate per step and per level."""
    from kvplan.results.report import prefix

    rows = data.result.prefix_caching or []
    fig, axes = _figure(13, 4.8, 2)
    prefix.plot_ttft_with_without(axes[0], rows)
    prefix.plot_prefix_kv(axes[1], rows)
    _save(fig, data.run_dir / "prefix_caching.png")
    fig, (ax,) = _figure(11, 4.5)
    prefix.plot_prefix_hit_rate(ax, data.steps, data.result.levels)
    _save(fig, data.run_dir / "prefix_hit_rate.png")
    return ["prefix_caching.png", "prefix_hit_rate.png"]


def render_report(
    run_dir: str | Path, charts: bool = True, data: RunData | None = None, steps_csv: Callable[[], None] | None = None
) -> RunData:
    """(Re)write summary.md, requests.csv, steps.csv and the PNGs of ``run_dir`` (``charts``
    False: no PNGs, the seconds a simulation spends otherwise; ``kvplan report`` draws them).
    ``data``: the run as just saved, when the caller holds it (else it is read from ``run_dir``).
    ``steps_csv``: steps.csv is made elsewhere (kvplan.results.csv_tables.StepsCsvChunks: it puts it in place),
    and this waits for it before the report is marked written (None: written here).

    Raises:
        KvplanError: the folder holds no readable results.json of this schema version, a record
            file is damaged or missing, or holds fewer records than results.json counts (nothing
            is written then).
    """
    from kvplan.results.csv_tables import write_tables
    from kvplan.results.report.summary import summary_markdown

    data = load_run(run_dir) if data is None else data
    check_records(data)
    if not data.result.summarized:
        data = RunData(
            data.run_dir,
            summarize(data.result, data.requests, data.steps, data.server_samples),
            data.requests,
            data.steps,
            data.server_samples,
        )
        save_result(data.run_dir, data.result)
    write_tables(data.run_dir, data.requests, data.steps, steps_csv=steps_csv is None)
    chart_names = render_charts(data) if charts else []
    write_atomic(data.run_dir / "summary.md", summary_markdown(data.result, chart_names))
    if steps_csv is not None:
        steps_csv()
    if not data.result.report_written:  # an older run's file is otherwise left as it was
        data = RunData(
            data.run_dir,
            data.result.model_copy(update={"report_written": True}),
            data.requests,
            data.steps,
            data.server_samples,
        )
        save_result(data.run_dir, data.result)
    return data


def print_summary(result: RunResult, console) -> None:
    """The knee table and one narrow row per level (latencies in ms, goodput in req/s)."""
    from kvplan.results.report import admission, prefix, tables, traffic

    for title, frame in (
        ("Knee: predicted max concurrency vs measured", tables.knee_table(result)),
        ("Per level (ms; goodput req/s)", tables.console_table(result)),
        ("Steady state: measured requests and window (s from the level's start)", tables.steady_table(result)),
        ("Capacity within the SLO (simulated; goodput req/s)", tables.capacity_table(result)),
        ("Prefix caching: TTFT (ms) cached vs uncached", prefix.prefix_table(result).iloc[:, :7]),
        ("Interference: P99 (ms) of each class mixed vs alone", traffic.interference_table(result)),
        ("Engine variants: P99 (ms) side by side", traffic.variant_table(result)),
        ("Admission: shed per level (TTFT P99 of the admitted, ms)", admission.shed_table(result)),
        ("Admission: shed per tenant", admission.tenant_table(result)),
    ):
        if not frame.empty:
            console.print(tables.to_rich(frame, title))
