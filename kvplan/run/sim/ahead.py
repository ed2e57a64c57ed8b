"""Capacity probes simulated side by side: the level a search will ask next, on a process forked
from this one while this one simulates the level it asks now (kvplan.run.sim.search).

A probe is deterministic (a fresh backend and clock, the level's own seeds and jitter stream), so
a level simulated on a forked process has the summary and score it would have here; the search
reads them as if it had simulated them itself, in its own order, and its answers are the same.
Only the wall time differs: on a second idle core two levels take the time of the longer one.
A level simulated ahead that the search then does not ask costs CPU time only (its process is
stopped once the search is done; nothing waits for it).

Which levels go side by side: the two ends of a steered search's guessed answer (the failing
end is simulated first, the holding one next when the guess is right: kvplan.run.sim.brackets.
steered), and the rate search's first two rates (its start, and twice it up to the saturation
rate, which it asks next when the start holds; or the saturation rate and the start, where the
saturation rate is asked first). Where the forked process fails (no fork, an error
in it), the level is simulated here when asked, as without this.

Before the levels are done (``ahead`` a call that says no: a search beside a simulation's
levels, which hold the other core), the second level still goes to a forked process, which
waits, asleep, till they are done and then runs on the core they leave, while this one may still
be simulating the first. Asked while the levels still run (so before it started), it is stopped
and simulated here.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
Key = tuple[str, float]  # (mode, level) of a capacity probe
GATE_POLL_S = 0.005  # how often a forked level waiting for the levels to be done looks


class Probes(dict):
    """A capacity search's probes, (mode, level) -> LevelSummary, each simulated once by
    ``simulate(mode, level)`` (its summary and score, which goes into ``scores`` under
    ``(bucket_index, mode, level)``); with ``ahead`` (True, or a call: a search beside a
    simulation's levels, which says whether they are done; while it says no, the forked one waits
    for them, the module docstring), ``both`` simulates the second of two on a forked process while this one
    simulates the first, and ``probe`` takes its result when the search asks for it. Forked
    processes whose probe was never asked are stopped once this is collected (weakref.finalize)."""

    def __init__(
        self,
        simulate: Callable[..., tuple[Any, float | None]],
        scores: dict,
        bucket_index: int,
        ahead: bool | Callable[[], bool],
    ):
        super().__init__()
        self.simulate, self.scores, self.bucket_index, self.ahead = simulate, scores, bucket_index, ahead
        self.pending: dict[Key, Pending] = {}
        weakref.finalize(self, _cancel, self.pending)

    def _keep(self, key: Key, got: tuple[Any, float | None] | None) -> None:
        if got is not None:
            self[key] = got[0]
            if got[1] is not None:
                self.scores[(self.bucket_index, *key)] = got[1]

    def probe(self, mode: str, level: float) -> Any:
        """The summary of the probe at ``level`` (``mode``: closed or open): simulated ahead, else
        simulated now if new."""
        key = (mode, level)
        if key not in self and key in self.pending:
            forked = self.pending.pop(key)
            if forked.gated and not forked.ready() and not self._ahead():
                forked.cancel()  # waiting for the levels to be done, not started: simulated here
            else:
                self._keep(key, forked.result())
        if key not in self:
            self._keep(key, self.simulate(mode, level))
        return self[key]

    def both(self, first: Key, second: Key) -> None:
        """Simulate ``first`` now and ``second`` on a forked process meanwhile (neither simulated
        yet), with ``ahead`` (else nothing: each is simulated when asked); where ``ahead()`` says
        no, the forked one waits till it says yes (the module docstring)."""
        if self.ahead is False or first == second or {first, second} & (self.keys() | self.pending.keys()):
            return
        there = lambda: self.simulate(*second)  # noqa: E731
        gate = None if self._ahead() else self._ahead  # (a call, as it says no)
        got, pending = side_by_side(lambda: self.simulate(*first), there, gate)
        self._keep(first, got)
        if pending is not None:
            self.pending[second] = pending

    def _ahead(self) -> bool:
        return bool(self.ahead()) if callable(self.ahead) else self.ahead


class Pending:
    """A forked process simulating one result: ``result()`` waits for it (None: it failed),
    ``ready()`` says whether it has ended, ``cancel()`` stops it; ``gated``: it waits for a gate
    before it runs (side_by_side)."""

    def __init__(self, pid: int, read: int, gated: bool = False):
        self.pid, self.read, self.gated = pid, read, gated

    def ready(self) -> bool:
        """Whether its result (or its end) can be read without waiting."""
        return bool(select.select([self.read], [], [], 0)[0])

    def result(self) -> Any | None:
        with os.fdopen(self.read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(self.pid, 0)
        return pickle.loads(data) if status == 0 and data else None

    def cancel(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(self.read)
        os.waitpid(self.pid, 0)


def _cancel(pending: dict[Key, Pending]) -> None:
    for forked in pending.values():
        forked.cancel()
    pending.clear()


def side_by_side(
    here: Callable[[], T], there: Callable[[], Any], gate: Callable[[], bool] | None = None
) -> tuple[T, Pending | None]:
    """(``here()``, the forked process running ``there``, its result pickled back through a pipe
    when asked): ``here`` runs in this one meanwhile. None where there is no fork, or more threads
    than this one (a fork copies one). ``gate``: the forked process sleeps till ``gate()`` says
    yes (looking every GATE_POLL_S), then runs ``there``; it leaves if this process ends first.
    Raises what ``here`` raises (the fork then stopped)."""
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return here(), None
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return here(), None
    if pid == 0:  # the forked process: run there, send its result, leave without cleaning up
        os.close(read)
        code, parent = 0, os.getppid()
        try:
            while gate is not None and not gate():
                if os.getppid() != parent:  # the search that asked is gone (stopped): so is this
                    os._exit(1)
                time.sleep(GATE_POLL_S)
            data = pickle.dumps(there(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write, "wb") as out:
                out.write(data)
        except BaseException:  # noqa: BLE001 - any failure: the caller simulates it itself
            code = 1
        os._exit(code)
    os.close(write)
    pending = Pending(pid, read, gate is not None)
    try:
        return here(), pending
    except BaseException:
        pending.cancel()
        raise
