"""``kvplan report``: re-render a saved run's views, or print its summary as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvplan.cli.app import make_console
from kvplan.cli.compare import compare_views


def report(
    run_dir: Annotated[Path, typer.Argument(help="A run folder written by kvplan loadtest, simulate or plan.")],
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the run's summary as one JSON object (its shape: docs/reports.md) instead of re-rendering it.",
        ),
    ] = False,
    compare: Annotated[
        Path | None,
        typer.Option(
            help="Another run folder to set this one against, level by level (as `kvplan compare RUN_DIR COMPARE`)."
        ),
    ] = None,
) -> None:
    """Re-render summary.md, the CSV tables and the charts of a saved run, without re-running it."""
    from kvplan.results.plan_result import is_plan_dir

    if is_plan_dir(run_dir):
        _plan_report(run_dir, json_output, compare)
        return
    if compare is not None:
        from kvplan.results.run_result import read_result

        read_result(compare)  # a bad second folder fails before anything is written
    if json_output:  # the views are left as they are; only a comparison asked for is written
        import json

        from kvplan.results.run_result import check_records, load_run, read_result
        from kvplan.results.summarize import summarize
        from kvplan.results.summary_json import summary_json

        result = read_result(run_dir)
        if not result.summarized:  # a run killed before its summaries: computed from the records, not saved
            data = load_run(run_dir)
            check_records(data)
            result = summarize(data.result, data.requests, data.steps)
        if compare is not None:
            compare_views(run_dir, compare, quiet=True)
        print(json.dumps(summary_json(result), indent=2))
        return
    from kvplan.results.report.render import print_summary, render_report

    data = render_report(run_dir)
    if compare is not None:
        compare_views(run_dir, compare)
    console = make_console()
    print_summary(data.result, console)
    console.print(f"report: {run_dir}", markup=False, highlight=False)


def _plan_report(run_dir: Path, json_output: bool, compare: Path | None) -> None:
    """A ``kvplan plan`` folder: its summary.md, configs.csv and pareto.png rebuilt from plan.json
    (or plan.json printed, with --json)."""
    from kvplan.errors import KvplanError
    from kvplan.results.plan_result import read_plan
    from kvplan.results.report.plan import render_plan
    from kvplan.results.report.plan_view import print_plan

    if compare is not None:
        raise KvplanError("compare", f"{run_dir} is a kvplan plan folder", "compare load test or simulate folders")
    if json_output:
        print(read_plan(run_dir).model_dump_json(indent=2))
        return
    run = render_plan(run_dir)
    console = make_console()
    cut = (len(run.configs), run.num_configs) if run.interrupted else None
    print_plan(run.configs, run.model, run.load, console, interrupted=cut)
    for verdict in (run.disagg_verdict, run.offload_verdict):
        if verdict:
            console.print(verdict, markup=False, highlight=False, soft_wrap=True)
    console.print(f"report: {run_dir}", markup=False, highlight=False)
