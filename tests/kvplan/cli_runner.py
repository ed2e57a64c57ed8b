"""Run the `kvplan` console-script entry point in-process and capture what it prints."""

import contextlib
import io
import sys

import pytest

from kvplan.cli import main


def run_cli(*args: str) -> tuple[int, str, str]:
    """``kvplan ARGS`` through :func:`kvplan.cli.main`: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["kvplan", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as done:
            main()
    finally:
        sys.argv = argv
    return done.value.code or 0, out.getvalue(), err.getvalue()
