"""The step times aiconfigurator-core's engine gave a silicon target, kept on disk across processes.

``SiliconStepCost`` (kvplan.sizing.gpus.silicon) asks the engine once per distinct rounded shape
and keeps the answer in a memo shared by every cost model of that target in a process. The
answers depend only on the engine, which depends only on the target and the package's data (the
kept spec's key: kvplan.sizing.gpus.silicon_spec), so the memo is kept beside the spec, under
the same key: ``$KVPLAN_CACHE/aiconfigurator/steps-<key>.bin``. A later process that finds it
reads the answers asked before and builds the engine (and warms it up) only when it is asked a
shape the file lacks (``LazyHandle``): then in each process that asks one (a run's forked
searches too), where the engine used to be built once before they forked. The 100-configuration
plan of docs/plan.md asks about 6,000 shapes of each of its 20 targets (GPU kind x tp); a file is
read in a few ms, against 0.1-0.4 s to build a target's engine and load its tables
(docs/benchmarks.md#silicon-memo).

The file is written only after the engine answered the warm-up (kvplan.sizing.gpus.silicon_spec
``warm_up``), so a kept memo means the target's data covers it: a run that finds one does not warm
up before it starts (a shape or precision the data lacks was found by the run that kept it). The
answers are the engine's floats, written by ``marshal`` (exact; a file of another Python's
marshal version is not read), so every step time is the same with or without the file
(tests/kvplan/sizing/test_silicon_memo.py). ``keep_step_times()`` writes every memo of this
process that gained entries: merged with what another process wrote meanwhile, written whole or
not at all (a cache: a failure is ignored).
"""

from __future__ import annotations

import atexit
import marshal
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HEADER = f"kvplan-step-memo-1 marshal {marshal.version} python {sys.version_info[0]}.{sys.version_info[1]}\n".encode()
_MEMOS: list[StepMemo] = []  # every memo of this process that has a file


class StepMemo(dict):
    """``(kind, *shape) -> ms`` (kvplan.sizing.gpus.silicon ``SiliconStepCost._ask``'s answers),
    read from ``path`` where it holds a memo this module wrote (``kept``: True then); None: never
    read nor written."""

    def __init__(self, path: Path | None = None):
        super().__init__()
        self.path = path
        self.kept = False
        self._written = 0  # entries the file is known to hold
        if path is None:
            return
        entries = _read(path)
        if entries is not None:
            self.update(entries)
            self.kept, self._written = True, len(entries)
        _MEMOS.append(self)

    def keep(self) -> None:
        """Write the memo to its file if it gained entries since it was read or last written (with
        the file's own entries that this process lacks)."""
        if self.path is None or len(self) <= self._written:
            return
        on_disk = _read(self.path) or {}
        for key, ms in on_disk.items():
            self.setdefault(key, ms)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(_HEADER + marshal.dumps(dict(self)))
            partial.replace(self.path)
        except OSError:
            return
        self.kept, self._written = True, len(self)


def _read(path: Path) -> dict[tuple, float] | None:
    """The entries of a memo file this module wrote whole, under this Python's marshal version;
    None where there is none or it is not."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.startswith(_HEADER):
        return None
    try:
        entries = marshal.loads(data[len(_HEADER) :])
    except (ValueError, EOFError, TypeError):
        return None
    return entries if isinstance(entries, dict) else None


def keep_step_times() -> None:
    """Write every memo of this process that gained entries: at this process's exit, and after
    each search in the processes forked to simulate, whose ``atexit`` never runs
    (kvplan.run.sim.run, kvplan.optimize.plan_pool)."""
    for memo in _MEMOS:
        memo.keep()


atexit.register(keep_step_times)


class LazyHandle:
    """An engine handle built by ``build()`` when first used (an attribute read), then given to
    ``then`` (kvplan.sizing.gpus.silicon_spec ``warm_up``: its tables loaded side by side), for a
    target whose kept memo may answer every shape asked."""

    def __init__(self, build: Callable[[], Any], then: Callable[[Any], Any] = lambda handle: None):
        self._build: Callable[[], Any] | None = build
        self._then = then
        self._handle: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._build is not None:
            handle, self._build = self._build(), None
            self._then(handle)
            self._handle = handle
        return getattr(self._handle, name)
