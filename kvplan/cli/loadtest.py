"""``kvplan loadtest``: a workload on the bundled engine, or on a remote server with ``--target``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvplan.cli.app import error_line, exit_interrupted, make_console, warn


def loadtest(
    workload: Annotated[Path, typer.Argument(help="Workload YAML, e.g. workloads/chat.yaml.")],
    out: Annotated[Path | None, typer.Option(help="Report folder (default: reports/<name>-<timestamp>/).")] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bars or tables: print only the report folder.")] = False,
    target: Annotated[
        str | None,
        typer.Option(
            help="Load-test a running OpenAI-compatible server at this base URL (http://HOST:PORT/v1) instead of"
            " the bundled engine; overrides the workload's target.url."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="With a target: the served model for kvplan's KV estimate (preset, config.json or GGUF);"
            " overrides target.estimate_model."
        ),
    ] = None,
) -> None:
    # one line: `kvplan --help` shows this paragraph's line breaks as they are written
    """Run a workload's buckets and load levels on the bundled engine, or on a remote server (--target); write the report folder (Ctrl-C keeps what finished, exit 130)."""  # noqa: E501
    from kvplan.results.report.render import print_summary
    from kvplan.results.run_result import read_result
    from kvplan.workload.file import load_workload

    console = make_console()
    spec = load_workload(workload)
    warn(spec.warnings, spec.source)
    if target is not None or model is not None or spec.target is not None:
        from kvplan.run.server.run import run_target_loadtest
        from kvplan.workload.file import with_target

        spec, url_field = with_target(spec, target, model)
        run_dir = run_target_loadtest(spec, out, url_field=url_field, console=None if quiet else console)
    else:
        from kvplan.run.loadtest import run_loadtest

        run_dir = run_loadtest(spec, out, console=None if quiet else console)
    result = read_result(run_dir)
    if not quiet:
        print_summary(result, console)
    console.print(f"report: {run_dir}", markup=False, highlight=False)
    if result.stop_reason:  # the server went away: a valid partial report, and a failed command
        error_line(f"stopped: {result.stop_reason}; the report keeps the requests that finished ({run_dir})")
        raise typer.Exit(1)
    if result.status == "interrupted":  # a stopped run exits as SIGINT does, whatever it kept
        exit_interrupted(run_dir)
