"""The traffic views of a run: request classes per level, each class mixed against alone
(interference), and engine variants side by side (summary.md's sections, console tables, a chart).

Present only where the run has them: a bucket with a ``mix`` (kvplan.results.stats.classes), classes run
alone (kvplan.results.stats.interference) or more than one engine variant (kvplan.workload.variants).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from kvplan.results.metrics import LatencyStats, LevelSummary
from kvplan.results.report import tables
from kvplan.results.report.plots import no_data
from kvplan.results.run_result import RunResult
from kvplan.results.stats.interference import ClassInterference, interference
from kvplan.results.stats.prefix_metrics import VARIANTS as PREFIX_VARIANTS
from kvplan.results.stats.variants import is_alone

if TYPE_CHECKING:  # matplotlib loads only where a chart is drawn
    from matplotlib.axes import Axes


def _p(stats: LatencyStats | None, key: str) -> float | None:
    return None if stats is None else getattr(stats, key)


def class_table(result: RunResult) -> pd.DataFrame:
    """Per mixed level and class: completed requests, TTFT/TPOT P50 and P99, E2E P99 (ms), SLO
    attainment (its class's SLO) and goodput (req/s)."""
    rows = [
        {
            "bucket": lv.bucket,
            "level": tables.level_name(lv),
            "class": c.name,
            "done": f"{c.num_completed}/{c.num_requests}",
            "TTFT P50": _p(c.ttft_ms, "p50"),
            "TTFT P99": _p(c.ttft_ms, "p99"),
            "TPOT P50": _p(c.tpot_ms, "p50"),
            "TPOT P99": _p(c.tpot_ms, "p99"),
            "E2E P99": _p(c.e2e_ms, "p99"),
            "SLO attainment": c.slo_attainment,
            "goodput": c.goodput_rps,
        }
        for lv in result.levels
        for c in lv.classes
    ]
    return pd.DataFrame(rows)


def _level_label(row: ClassInterference) -> str:
    label = f"c={int(row.level)}" if row.mode == "closed" else f"{row.level:g} req/s"
    return f"{label} {row.variant}" if row.variant else label


def interference_table(result: RunResult) -> pd.DataFrame:
    """Per mixed level and class: P99 TTFT and TPOT (ms) mixed and alone, and mixed / alone."""
    rows = [
        {
            "bucket": r.bucket,
            "level": _level_label(r),
            "class": r.request_class,
            "TTFT P99 mixed": r.ttft_p99_ms_mixed,
            "TTFT P99 alone": r.ttft_p99_ms_alone,
            "TTFT x": r.ratio(r.ttft_p99_ms_mixed, r.ttft_p99_ms_alone),
            "TPOT P99 mixed": r.tpot_p99_ms_mixed,
            "TPOT P99 alone": r.tpot_p99_ms_alone,
            "TPOT x": r.ratio(r.tpot_p99_ms_mixed, r.tpot_p99_ms_alone),
        }
        for r in interference(result.levels)
    ]
    return pd.DataFrame(rows)


def engine_variants(result: RunResult) -> list[str]:
    """The engine variants the run's levels ran on, in run order ([] with fewer than two)."""
    names = list(
        dict.fromkeys(
            lv.variant for lv in result.levels if not is_alone(lv.variant) and lv.variant not in ("", *PREFIX_VARIANTS)
        )
    )
    return names if len(names) > 1 else []


def variant_table(result: RunResult) -> pd.DataFrame:
    """Per bucket, level and class (the level itself, ``all``, for every level): P99 TTFT and TPOT
    (ms) on each engine variant, side by side; empty with fewer than two variants."""
    names = engine_variants(result)
    if not names:
        return pd.DataFrame()
    rows: dict[tuple, dict] = {}
    for lv in result.levels:
        if lv.variant not in names:
            continue
        label = f"c={int(lv.level)}" if lv.mode == "closed" else f"{lv.level:g} req/s"
        parts: list[tuple[str, LatencyStats | None, LatencyStats | None]] = [("all", lv.ttft_ms, lv.tpot_ms)]
        parts += [(c.name, c.ttft_ms, c.tpot_ms) for c in lv.classes]
        for name, ttft, tpot in parts:
            row = rows.setdefault(
                (lv.bucket, lv.mode, lv.level, name), {"bucket": lv.bucket, "level": label, "class": name}
            )
            row[f"TTFT P99 {lv.variant}"] = _p(ttft, "p99")
            row[f"TPOT P99 {lv.variant}"] = _p(tpot, "p99")
    frame = pd.DataFrame(list(rows.values()))
    ordered = ["bucket", "level", "class"] + [f"{m} P99 {v}" for m in ("TTFT", "TPOT") for v in names]
    return frame[[c for c in ordered if c in frame.columns]]


def traffic_markdown(result: RunResult) -> list[str]:
    """summary.md's traffic sections ([] for a run with no mix and one engine variant)."""
    lines: list[str] = []
    classes, alone, variants = class_table(result), interference_table(result), variant_table(result)
    if not classes.empty:
        lines += [
            "",
            "## Request classes (ms; goodput req/s)",
            "",
            "Each mixed level's requests by class, drawn by weight into one stream and run together; each"
            " class is judged by its own SLO (the workload's, with the class's limits in their place).",
            "",
            tables.to_markdown(classes).rstrip("\n"),
        ]
    if not alone.empty:
        lines += [
            "",
            "## Interference: each class mixed against alone (P99, ms)",
            "",
            "Alone: the class's own requests of the level, at its share of the load (concurrency x"
            " weight share, rounded, at least 1; rate x share). x = mixed / alone: above 1, the mix"
            " (another class's prefills in the same batch) slows the class.",
            "",
            tables.to_markdown(alone).rstrip("\n"),
        ]
    if not variants.empty:
        lines += [
            "",
            "## Engine variants side by side (P99, ms)",
            "",
            "Every level ran once per engine variant, on the same requests.",
            "",
            tables.to_markdown(variants).rstrip("\n"),
        ]
    return lines


def plot_interference(ax: Axes, rows: list[ClassInterference]) -> None:
    """P99 TTFT per class, mixed against alone, one group of bars per mixed level."""
    ax.set_title("P99 TTFT: each class mixed vs alone")
    rows = [r for r in rows if r.ttft_p99_ms_mixed is not None and r.ttft_p99_ms_alone is not None]
    if not rows:
        return no_data(ax, "no class ran both mixed and alone")
    many = len({r.bucket for r in rows}) > 1
    level = lambda r: f"c={int(r.level)}" if r.mode == "closed" else f"{r.level:g} req/s"  # noqa: E731
    labels = ["\n".join(p for p in (r.bucket if many else "", level(r), r.variant, r.request_class) if p) for r in rows]
    x = range(len(rows))
    mixed = [r.ttft_p99_ms_mixed or 0.0 for r in rows]  # none is None: filtered above
    alone = [r.ttft_p99_ms_alone or 0.0 for r in rows]
    ax.bar([i - 0.2 for i in x], mixed, 0.4, label="mixed", color="tab:red")
    ax.bar([i + 0.2 for i in x], alone, 0.4, label="alone", color="tab:blue")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("P99 TTFT (ms)")
    ax.legend()


def has_interference(levels: list[LevelSummary]) -> bool:
    """Whether any class of the run ran alone (the chart has something to show)."""
    return bool(interference(levels))
