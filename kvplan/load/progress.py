"""Progress of a run's levels on the console: one rich bar per level (nothing when silent)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from kvplan.load.driver import Level


@contextlib.contextmanager
def level_progress(console, level: Level) -> Iterator[Callable[[], None]]:
    """A bar for ``level`` on ``console`` (None: silent); yields the callback that counts one
    finished request."""
    if console is None:
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"{level.key.name:<24}", total=len(level.requests))
        yield lambda: progress.advance(task)
