"""Progress of a run's levels on the console: one rich bar per level on a terminal; in CI logs
and pipes (no terminal), a plain line per level every few seconds and at its end::

    short c=8: 24/48 done, 8 in flight, 0 failed, 312.5 tok/s, 7.7 s

Nothing when silent (console None).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from kvplan.run.driver import Level

PLAIN_EVERY_S = 5.0


@contextlib.contextmanager
def level_progress(console, level: Level, every_s: float = PLAIN_EVERY_S) -> Iterator[Callable[..., None]]:
    """Progress for ``level`` on ``console`` (None: silent); yields the callback the recorder
    calls per finished request: ``advance(finished, in_flight)``."""
    if console is None:
        yield lambda *args: None
        return
    if not console.is_terminal:
        with _plain(console, level, every_s) as advance:
            yield advance
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"{level.key.name:<24}", total=len(level.requests))
        yield lambda *args: progress.advance(task)


@contextlib.contextmanager
def _plain(console, level: Level, every_s: float) -> Iterator[Callable[..., None]]:
    start = time.perf_counter()
    state = {"done": 0, "failed": 0, "rejected": 0, "tokens": 0, "in_flight": 0, "last": start}

    def line() -> None:
        elapsed = time.perf_counter() - start
        rate = state["tokens"] / elapsed if elapsed > 0 else 0.0
        shed = f" {state['rejected']} rejected," if state["rejected"] else ""  # admission's refusals
        console.print(
            f"{level.key.name}: {state['done']}/{len(level.requests)} done, {state['in_flight']} in flight,"
            f" {state['failed']} failed,{shed} {rate:,.1f} tok/s, {elapsed:.1f} s",
            markup=False,
            highlight=False,
        )

    def advance(finished=None, in_flight: int = 0) -> None:
        state["done"] += 1
        state["in_flight"] = in_flight
        if finished is not None:
            if finished.finish_reason == "rejected":
                state["rejected"] += 1
            elif finished.finish_reason not in ("stop", "length"):
                state["failed"] += 1
            else:
                state["tokens"] += finished.num_output_tokens
        now = time.perf_counter()
        if now - state["last"] >= every_s:
            state["last"] = now
            line()

    yield advance
    line()
