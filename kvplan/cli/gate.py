"""``kvplan gate``: a run against a committed baseline; exit 0 pass, 1 regression, 2 bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvplan.cli.app import make_console
from kvplan.errors import KvplanError


def gate(
    run_dir: Annotated[Path, typer.Argument(help="A run folder written by kvplan loadtest.")],
    baseline: Annotated[Path, typer.Option(help="Baseline YAML, e.g. baselines/ci.yaml.")],
    update_baseline: Annotated[
        bool,
        typer.Option(help="Write this run as the new baseline (keeping the file's tolerances) instead of comparing."),
    ] = False,
    junit: Annotated[Path | None, typer.Option(help="Also write JUnit XML here: one test case per check.")] = None,
) -> None:
    # one line: `kvplan --help` shows this paragraph's line breaks as they are written
    """Compare a run with a baseline, metric by metric: exit 0 when every check holds, 1 on any regression, 2 on bad input."""  # noqa: E501
    from kvplan.gate.gate import record_baseline, run_gate

    console = make_console()
    if update_baseline:
        if junit is not None:
            raise KvplanError("junit", "there are no checks to write with `update_baseline`", "drop one of the two")
        path, count = record_baseline(run_dir, baseline)
        console.print(
            f"baseline written: {path} ({count} values from {run_dir})", markup=False, highlight=False, soft_wrap=True
        )
        return
    from kvplan.gate.view import render_gate, write_junit

    result = run_gate(run_dir, baseline)
    if junit is not None:
        write_junit(result, junit)
    render_gate(result, console)
    raise typer.Exit(result.exit_code)
