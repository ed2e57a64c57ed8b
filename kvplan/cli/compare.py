"""``kvplan compare``: two runs side by side, level by level."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvplan.cli.app import make_console, warn


def compare_runs(
    run_a: Annotated[Path, typer.Argument(help="Run folder A (e.g. a simulation).")],
    run_b: Annotated[
        Path, typer.Argument(help="Run folder B to set A against (e.g. the measured run); error % = (A - B) / B.")
    ],
) -> None:
    # one line: `kvplan --help` shows this paragraph's line breaks as they are written
    """Two runs side by side, level by level: each metric of A and B with A's error in %, a table and a PNG per metric in A/compare-<B>/."""  # noqa: E501
    compare_views(run_a, run_b)


def compare_views(run_a: Path, run_b: Path, quiet: bool = False) -> None:
    """Write A/compare-<B>/ (tables and PNGs) and, unless ``quiet``, print the two wide tables. The
    levels only one run has are left out of both; a line per run names them, after the tables (on
    stderr when ``quiet``, where stdout is ``kvplan report --json``'s)."""
    from kvplan.results.report.compare import left_out_lines, wide_table, write_results_comparison
    from kvplan.results.report.tables import to_rich
    from kvplan.results.run_result import read_result

    a, b = read_result(run_a), read_result(run_b)
    out, frame = write_results_comparison(a, b, run_a, run_b)
    left_out = left_out_lines(a, b, (str(run_a), str(run_b)))
    if quiet:
        warn(left_out, "compare")
        return
    console = make_console()
    for title, metrics in (
        ("latency P50 / P95 (ms)", ("TTFT P50 ms", "TTFT P95 ms", "TPOT P50 ms", "TPOT P95 ms")),
        ("throughput, goodput and KV", ("output tok/s", "goodput req/s", "preemptions", "peak used blocks")),
    ):
        console.print(to_rich(wide_table(frame, metrics), f"A {run_a} vs B {run_b}: {title}; err % = (A - B) / B"))
    for line in left_out:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(f"comparison: {out}", markup=False, highlight=False)
