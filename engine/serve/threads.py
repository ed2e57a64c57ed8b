"""Keep torch's OpenMP worker team on the engine-loop thread alone.

torch's CPU kernels run on OpenMP (GNU libgomp in the PyPI wheels). libgomp gives every thread that
opens a parallel region its own team of workers and counts all of them; once it manages more threads
than there are CPUs, a waiting thread spins only briefly (GCC libgomp's ``env.c``:
``gomp_throttled_spin_count_var``, 1,000 spins, against ``gomp_spin_count_var``'s 300,000 without
``OMP_WAIT_POLICY``) and then sleeps on a futex, so each of a step's hundreds of parallel regions
waits for a wake-up. ``python -m engine.serve`` loaded the model on the main thread (a team of
``torch.get_num_threads()``) and stepped it on the engine-loop thread (a second team): on 2 CPUs,
3 managed threads. Measured on Xeon-AMX (docs/benchmarks.md#engine-serve): a 32-decode step of
SmolLM2-135M took ~120 ms on the loop thread against 79 ms on the main thread.

The fix: the main thread never opens a team. ``torch_threads_for_engine_loop`` sets the main thread's
torch threads to 1 while the server runs (the model loads on that one thread, with no workers) and
remembers the count it had; the engine-loop thread calls ``adopt`` when it starts and takes that
count. Where nothing reserved them (tests, the in-process engine) ``adopt`` does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_reserved: int | None = None  # the main thread's torch threads while torch_threads_for_engine_loop holds them


@contextlib.contextmanager
def torch_threads_for_engine_loop() -> Iterator[int]:
    """Within the block, torch runs on one thread on the calling (main) thread and the engine-loop
    thread takes the threads it had (``adopt``); they are given back on exit. Enter it before any
    torch work on the calling thread, or that work has opened a team already. Yields the count."""
    global _reserved
    count = torch.get_num_threads()
    _reserved = count
    torch.set_num_threads(1)
    try:
        yield count
    finally:
        _reserved = None
        torch.set_num_threads(count)


def adopt() -> None:
    """On the engine-loop thread, at its start: torch's threads as the main thread had them before
    ``torch_threads_for_engine_loop`` (nothing when that is not held)."""
    if _reserved is not None:
        torch.set_num_threads(_reserved)
