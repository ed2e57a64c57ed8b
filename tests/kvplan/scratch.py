"""Scratch folders for tests whose module-scoped fixtures cannot take pytest's ``tmp_path``: made
under one folder per test process, removed when the process exits (``tempfile.mkdtemp`` alone
left one behind in /tmp per test run)."""

import atexit
import shutil
import tempfile
from pathlib import Path

_ROOT = Path(tempfile.mkdtemp(prefix="kvplan-tests-"))
atexit.register(shutil.rmtree, _ROOT, True)


def scratch(prefix: str) -> Path:
    """A new empty folder named from ``prefix``, removed with the others at exit."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_ROOT))
