"""Two runs side by side, level by level: simulated against measured, or run against run.

``kvplan compare A B`` and ``kvplan report A --compare B`` read both run results (any source) and
pair their levels by key (bucket, mode, level, variant). For every metric below and every level
both ran, the table shows A, B and A's error relative to B in % (``(A - B) / B``; with A
simulated and B measured, the simulation's error). Written into ``A/compare-<B's folder name>/``::

    compare.csv, compare.md    one row per level and metric: A, B, error %
    <metric>.png               per metric, A's and B's curves against the level, per bucket and mode
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from kvplan.results.metrics import LevelSummary
from kvplan.results.records import LevelKey
from kvplan.results.report import tables
from kvplan.results.report.plots import level_axis, no_data
from kvplan.results.run_result import RunResult, read_result
from kvplan.results.store import write_atomic

# metric name -> (file stem, value of a level summary)
METRICS = {
    "TTFT P50 ms": ("ttft_p50", lambda lv: lv.ttft_ms and lv.ttft_ms.p50),
    "TTFT P95 ms": ("ttft_p95", lambda lv: lv.ttft_ms and lv.ttft_ms.p95),
    "TPOT P50 ms": ("tpot_p50", lambda lv: lv.tpot_ms and lv.tpot_ms.p50),
    "TPOT P95 ms": ("tpot_p95", lambda lv: lv.tpot_ms and lv.tpot_ms.p95),
    "ITL P50 ms": ("itl_p50", lambda lv: lv.itl_ms and lv.itl_ms.p50),
    "E2E P50 ms": ("e2e_p50", lambda lv: lv.e2e_ms and lv.e2e_ms.p50),
    "output tok/s": ("output_tokens_per_s", lambda lv: lv.output_tokens_per_s),
    "goodput req/s": ("goodput_rps", lambda lv: lv.goodput_rps),
    "preemptions": ("preemptions", lambda lv: lv.num_preemptions),
    "peak used blocks": ("peak_used_blocks", lambda lv: lv.peak_used_blocks),
}


def error_pct(a: float | None, b: float | None) -> float | None:
    """(a - b) / b in %; 0 when both are 0, None when either is missing or only b is 0."""
    if a is None or b is None:
        return None
    if b == 0:
        return 0.0 if a == 0 else None
    return (a - b) / b * 100


def paired_levels(a: RunResult, b: RunResult) -> list[tuple[LevelSummary, LevelSummary]]:
    """Levels both runs ran, in A's order."""
    theirs = {lv.key: lv for lv in b.levels}
    return [(lv, theirs[lv.key]) for lv in a.levels if lv.key in theirs]


def unpaired_levels(a: RunResult, b: RunResult) -> tuple[list[LevelKey], list[LevelKey]]:
    """The levels only A ran and those only B ran, each in its run's order: the comparison leaves
    them out, as it has nothing to set them against."""
    mine, theirs = {lv.key for lv in a.levels}, {lv.key for lv in b.levels}
    return [lv.key for lv in a.levels if lv.key not in theirs], [lv.key for lv in b.levels if lv.key not in mine]


def left_out_lines(a: RunResult, b: RunResult, names: tuple[str, str] = ("A", "B")) -> list[str]:
    """One line per run that ran levels the other did not (none when every level pairs), e.g.
    ``left out, only in B (runs/measured): short c=4, long c=3``; ``names`` name the two runs."""
    lines = []
    for side, name, keys in zip(("A", "B"), names, unpaired_levels(a, b)):
        if keys:
            lines.append(f"left out, only in {side} ({name}): {', '.join(key.name for key in keys)}")
    return lines


def compare_table(a: RunResult, b: RunResult) -> pd.DataFrame:
    """One row per paired level and metric: bucket, level, metric, A, B, error % (module docstring)."""
    rows = []
    for mine, theirs in paired_levels(a, b):
        for metric, (_, value) in METRICS.items():
            va, vb = value(mine), value(theirs)
            rows.append(
                {
                    "bucket": mine.bucket,
                    "level": tables.level_name(mine),
                    "metric": metric,
                    "A": va,
                    "B": vb,
                    "error %": error_pct(va, vb),
                }
            )
    return pd.DataFrame(rows, columns=["bucket", "level", "metric", "A", "B", "error %"])


def wide_table(frame: pd.DataFrame, metrics: tuple[str, ...]) -> pd.DataFrame:
    """``frame`` (compare_table's) as one row per level with ``A / B / err %`` columns per metric."""
    rows: dict[tuple[str, str], dict] = {}
    for r in frame[frame["metric"].isin(metrics)].to_dict("records"):
        row = rows.setdefault((r["bucket"], r["level"]), {"bucket": r["bucket"], "level": r["level"]})
        short = r["metric"].replace(" ms", "")
        row[f"{short} A"], row[f"{short} B"] = _num(r["A"]), _num(r["B"])
        row[f"{short} err %"] = _num(r["error %"], digits=3)
    return pd.DataFrame(list(rows.values()))


def _num(value, digits: int = 4) -> float | None:
    return None if value is None or pd.isna(value) else float(f"{value:.{digits}g}")


def plot_metric(ax, a: list[LevelSummary], b: list[LevelSummary], metric: str, labels: tuple[str, str]) -> None:
    """One metric against the level: A's curve and B's (levels of one bucket and mode)."""
    _, value = METRICS[metric]
    ax.set_title(metric)
    if not a and not b:
        return no_data(ax, "no level in common")
    for levels, label, style in ((a, labels[0], "o-"), (b, labels[1], "s--")):
        points = [(lv.level, value(lv)) for lv in levels if value(lv) is not None]
        if points:
            ax.plot(*zip(*points), style, label=label)
    level_axis(ax, [lv.level for lv in a + b])
    ax.set_xlabel("concurrency" if (a or b)[0].mode == "closed" else "request rate (req/s)")
    ax.legend(fontsize=8)


def write_comparison(run_a: str | Path, run_b: str | Path) -> tuple[Path, pd.DataFrame]:
    """Write ``A/compare-<B>/`` (module docstring); returns the folder and the table.

    Raises:
        KvplanError: either folder holds no readable run result.
    """
    run_a, run_b = Path(run_a), Path(run_b)
    return write_results_comparison(read_result(run_a), read_result(run_b), run_a, run_b)


def write_results_comparison(a: RunResult, b: RunResult, run_a: Path, run_b: Path) -> tuple[Path, pd.DataFrame]:
    """:func:`write_comparison` of results already read from the folders ``run_a`` and ``run_b``;
    compare.md ends with :func:`left_out_lines`, the levels only one run has."""
    from matplotlib.figure import Figure

    frame = compare_table(a, b)
    out = run_a / f"compare-{re.sub(r'[^A-Za-z0-9_.-]', '_', run_b.resolve().name)}"
    out.mkdir(exist_ok=True)
    frame.to_csv(out / "compare.csv", index=False)
    labels = (f"A: {a.source} {run_a.name}", f"B: {b.source} {run_b.resolve().name}")
    left_out = "".join(f"\n{line}\n" for line in left_out_lines(a, b, (run_a.name, run_b.resolve().name)))
    write_atomic(
        out / "compare.md",
        f"# {labels[0]} against {labels[1]}\n\nerror % = (A - B) / B\n\n" + tables.to_markdown(frame) + left_out,
    )
    pairs = paired_levels(a, b)
    groups = list(dict.fromkeys((x.bucket, x.mode, x.variant) for x, _ in pairs))
    for metric, (stem, _) in METRICS.items():
        fig = Figure(figsize=(4.5 * max(len(groups), 1), 4))
        for i, group in enumerate(groups or [None]):
            ax = fig.add_subplot(1, max(len(groups), 1), i + 1)
            own = [(x, y) for x, y in pairs if (x.bucket, x.mode, x.variant) == group]
            plot_metric(ax, [x for x, _ in own], [y for _, y in own], metric, labels)
            if group is not None:
                ax.set_title(f"{metric}: {' '.join(str(g) for g in group if g)}")
        fig.tight_layout()
        fig.savefig(out / f"{stem}.png", dpi=100)
    return out, frame
