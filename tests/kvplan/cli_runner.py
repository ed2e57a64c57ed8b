"""Run the `kvplan` console-script entry point in-process and capture what it prints."""

import contextlib
import gc
import io
import sys

import pytest

from kvplan.cli import main


def run_cli(*args: str) -> tuple[int, str, str]:
    """``kvplan ARGS`` through :func:`kvplan.cli.main`: (exit code, stdout, stderr). The collector's
    thresholds are put back after it, as a command's process ends with it (``kvplan simulate``
    sets its own: kvplan.cli.app.simulation_gc)."""
    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["kvplan", *args]
    thresholds = gc.get_threshold()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as done:
            main()
    finally:
        sys.argv = argv
        gc.set_threshold(*thresholds)
    return done.value.code or 0, out.getvalue(), err.getvalue()
