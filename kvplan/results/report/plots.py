"""Report charts: one ``plot_*(ax, data)`` per chart, drawing on a matplotlib Axes.

Figures are built with ``matplotlib.figure.Figure`` (Agg canvas, no pyplot state), saved, and
dropped. A chart with nothing to show writes "no data: <why>" on its axes instead of failing.
Data come from the saved result only: the run result's summaries and StepRecords.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvplan.results.metrics import LevelSummary
from kvplan.results.run_result import BucketSummary

if TYPE_CHECKING:  # matplotlib loads only where a chart is drawn
    from matplotlib.axes import Axes

MIB = 2**20
_PERCENTILE_STYLES = (("p50", "-"), ("p90", "--"), ("p99", ":"))
_VARIANT_COLORS = {"cached": "tab:blue", "uncached": "tab:red"}  # kvplan.results.stats.prefix_metrics' variants


def level_axis(ax: Axes, xs: Sequence[float]) -> None:
    """Ticks at the levels run; a log2 axis when they span 8x or more (1, 2, 4, ... 64)."""
    xs = sorted(set(xs))
    if xs and xs[0] > 0 and xs[-1] / xs[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.minorticks_off()


def no_data(ax: Axes, why: str) -> None:
    """Say on the chart that there is nothing to draw."""
    ax.text(0.5, 0.5, f"no data: {why}", ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def gaps(values: Iterable[float | None]) -> list[float]:
    """``values`` with None (no value) as NaN, which matplotlib leaves out (a gap), as it does None."""
    return [math.nan if v is None else v for v in values]


def _by(levels: Sequence[LevelSummary], *fields: str) -> dict[str, list[LevelSummary]]:
    """Levels grouped by the values of ``fields`` joined by spaces ("short cached"), in order."""
    groups: dict[str, list[LevelSummary]] = {}
    for lv in levels:
        groups.setdefault(" ".join(str(getattr(lv, f)) for f in fields).strip(), []).append(lv)
    return groups


def plot_kv_over_time(
    ax: Axes, steps: Sequence[Any], pool_bytes: int | None, shared_estimate_bytes: Sequence[int | None] = ()
) -> None:
    """KV bytes after each step (MiB) against time since the first step (s): measured (used
    blocks x bytes per block), the paged, ideal and contiguous estimates, and the pool size; in a
    shared_prefix run also the paged estimate with the prefix counted once (one value per step,
    None where it cannot be told: a gap)."""
    ax.set_title("KV cache over time: measured vs estimates")
    if not steps:
        return no_data(ax, "no engine step was recorded")
    t0 = steps[0].start_time
    t = [s.end_time - t0 for s in steps]
    series = [
        ("contiguous (max_model_len per request)", "contiguous_bytes", "tab:red", ":"),
        ("paged estimate (whole blocks)", "paged_bytes", "tab:orange", "-"),
        ("ideal estimate (tokens x bytes/token)", "ideal_bytes", "tab:green", "--"),
        ("measured (used blocks x bytes/block)", "measured_bytes", "tab:blue", "-"),
    ]
    top = max((pool_bytes or 0) / MIB, *(max(getattr(s, k) for s in steps) / MIB for _, k, _, _ in series[1:]))
    for label, key, color, style in series:
        values = [getattr(s, key) / MIB for s in steps]
        if key == "contiguous_bytes":
            label += f", peak {max(values):,.1f} MiB"
            if max(values) > 2 * top:  # a naive reservation dwarfs the pool: name it, do not draw it
                ax.plot([], [], " ", label=label + " (off scale)")
                continue
        width = 2.5 if key == "paged_bytes" else 1.2  # measured is drawn over paged: equal when exact
        ax.step(t, values, where="post", label=label, color=color, linestyle=style, linewidth=width)
    if any(v is not None for v in shared_estimate_bytes):
        values = [float("nan") if v is None else v / MIB for v in shared_estimate_bytes]
        ax.step(
            t,
            values,
            where="post",
            label="paged estimate, shared prefix once",
            color="tab:purple",
            linestyle="-.",
            linewidth=1.2,
        )
    if pool_bytes:
        ax.axhline(pool_bytes / MIB, color="black", linewidth=1, label="KV pool size")
    ax.set_ylim(0, top * 1.25 or 1)  # a drawn contiguous line may still exceed this: clipped
    previous = None
    for s, x in zip(steps, t):
        key = s.key
        if key != previous:
            ax.axvline(x, color="0.85", linewidth=0.8, zorder=0)
            ax.text(x, top * 1.2, s.key.name, fontsize=7, rotation=90, va="top", color="0.4")
            previous = key
    ax.set_xlabel("time since first step (s)")
    ax.set_ylabel("KV cache (MiB)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)


def plot_latency_vs_level(
    ax: Axes, levels: Sequence[LevelSummary], metric: str, knee: BucketSummary | None = None
) -> None:
    """One bucket's ``metric`` (ttft_ms, tpot_ms, e2e_ms) P50/P90/P99 against its load levels,
    with the measured knee and the predicted max concurrency as vertical lines when given."""
    name = metric[:-3].upper()
    ax.set_title(f"{name} percentiles")
    points = [lv for lv in levels if getattr(lv, metric)]
    if not points:
        return no_data(ax, f"no completed request with a {name}")
    for variant, own in _by(points, "variant").items():  # shared_prefix runs: cached, uncached
        color: dict[str, Any] = {"color": _VARIANT_COLORS[variant]} if variant in _VARIANT_COLORS else {}
        for key, style in _PERCENTILE_STYLES:
            ax.plot(
                [lv.level for lv in own],
                [getattr(getattr(lv, metric), key) for lv in own],
                style,
                marker="o",
                label=f"{key.upper()} {variant}".rstrip(),
                **color,
            )
    x = [lv.level for lv in points]
    if knee and knee.measured_knee is not None:
        ax.axvline(knee.measured_knee, color="tab:red", linewidth=1, label="measured knee")
    if knee and knee.predicted_max_concurrency is not None:
        ax.axvline(
            knee.predicted_max_concurrency,
            color="tab:red",
            linestyle="--",
            linewidth=1,
            label="predicted max concurrency",
        )
    level_axis(ax, x)
    ax.set_xlabel("concurrency (requests in flight)" if points[0].mode == "closed" else "request rate (req/s)")
    ax.set_ylabel(f"{name} (ms)")
    ax.legend(fontsize=8)


def plot_throughput(ax: Axes, levels: Sequence[LevelSummary]) -> None:
    """Output tokens/s against concurrency, one line per bucket (closed-loop levels)."""
    ax.set_title("Output throughput vs concurrency")
    closed = [lv for lv in levels if lv.mode == "closed" and lv.output_tokens_per_s is not None]
    if not closed:
        return no_data(ax, "no closed-loop level completed a request")
    for bucket, own in _by(closed, "bucket", "variant").items():
        ax.plot([lv.level for lv in own], gaps(lv.output_tokens_per_s for lv in own), marker="o", label=bucket)
    level_axis(ax, [lv.level for lv in closed])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ax.legend(fontsize=8)


def plot_goodput(ax: Axes, levels: Sequence[LevelSummary]) -> None:
    """Requests/s (dashed) and goodput under the SLO (solid) against concurrency, per bucket."""
    ax.set_title("Goodput vs concurrency")
    closed = [lv for lv in levels if lv.mode == "closed" and lv.requests_per_s is not None]
    if not closed:
        return no_data(ax, "no closed-loop level completed a request")
    for bucket, own in _by(closed, "bucket", "variant").items():
        x = [lv.level for lv in own]
        (line,) = ax.plot(x, gaps(lv.goodput_rps for lv in own), marker="o", label=f"{bucket} goodput")
        ax.plot(x, gaps(lv.requests_per_s for lv in own), "--", color=line.get_color(), label=f"{bucket} req/s")
    level_axis(ax, [lv.level for lv in closed])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("requests/s")
    ax.legend(fontsize=8)


def plot_estimate_vs_measured(ax: Axes, steps: Sequence[Any], shared_estimate_bytes: Sequence[int | None] = ()) -> None:
    """Per step, estimated KV (MiB) against measured KV (MiB); points on y = x are exact. In a
    shared_prefix run also the paged estimate with the prefix counted once, where it is told."""
    ax.set_title("Estimated vs measured KV, every step")
    busy = [s for s in steps if s.measured_bytes or s.paged_bytes]
    if not busy:
        return no_data(ax, "no step held KV")
    measured = [s.measured_bytes / MIB for s in busy]
    ax.scatter(measured, [s.ideal_bytes / MIB for s in busy], s=8, color="tab:green", label="ideal estimate")
    ax.scatter(
        measured,
        [s.paged_bytes / MIB for s in busy],
        s=14,
        facecolors="none",
        edgecolors="tab:orange",
        label="paged estimate",
    )
    shared = [
        (s.measured_bytes / MIB, e / MIB)
        for s, e in zip(steps, shared_estimate_bytes)
        if e is not None and (s.measured_bytes or s.paged_bytes)
    ]
    if shared:
        shared_x, shared_y = zip(*shared)
        ax.scatter(shared_x, shared_y, s=6, marker="x", color="tab:purple", label="paged estimate, shared prefix once")
    top = max(measured + [s.paged_bytes / MIB for s in busy])
    ax.plot([0, top], [0, top], color="black", linewidth=0.8, label="y = x")
    ax.set_xlabel("measured KV (MiB)")
    ax.set_ylabel("estimated KV (MiB)")
    ax.legend(fontsize=8)


def plot_peak_kv_per_level(ax: Axes, levels: Sequence[LevelSummary]) -> None:
    """Peak KV bytes per level (MiB, log scale): ideal, paged, measured, contiguous."""
    ax.set_title("Peak KV per level")
    if not levels or not any(lv.peak_measured_bytes for lv in levels):
        return no_data(ax, "no level held KV")
    keys = (
        ("peak_ideal_bytes", "ideal", "tab:green"),
        ("peak_paged_bytes", "paged", "tab:orange"),
        ("peak_measured_bytes", "measured", "tab:blue"),
        ("peak_contiguous_bytes", "contiguous", "tab:red"),
    )
    width = 0.8 / len(keys)
    for i, (key, label, color) in enumerate(keys):
        xs = [j + i * width for j in range(len(levels))]
        ax.bar(xs, [max(getattr(lv, key), 1) / MIB for lv in levels], width, label=label, color=color)
    names = ["\n".join([lv.bucket, *lv.key.label.split(" ", 1)]) for lv in levels]
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(levels))], names, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("peak KV (MiB, log)")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 10)  # a band above the tallest bar for the legend, which never covers one
    ax.legend(fontsize=8, loc="upper center", ncol=len(keys), frameon=False)
