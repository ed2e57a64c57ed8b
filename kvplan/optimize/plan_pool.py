"""Where ``kvplan plan``'s configurations are judged: here, on a process pool over this machine's
cores, or as Ray tasks on a cluster (``--ray``). The answers are the same everywhere: each
configuration is simulated whole by one worker from the same job (kvplan.optimize.plan.judge,
which is deterministic), so only the wall time differs.

Work goes out in chunks of one GPU kind, TP and dtypes (the scheduler limits vary inside a chunk),
so a worker builds that GPU's measured-silicon step model once for the chunk. Ctrl-C stops the
search and keeps what finished: pending chunks are not started (a pool lets those running
finish, Ray cancels them), and the caller gets the finished results with ``interrupted`` set.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from kvplan.errors import KvplanError
from kvplan.optimize.plan import ConfigResult, Job, judge, rank_key

RAY_HINT = "pip install 'kvplan[cluster]'"  # ray[client] too, for a ray:// address


@dataclass
class Outcome:
    """The results that finished, in the order they finished, with their job indices."""

    done: list[tuple[int, Any]]
    interrupted: bool = False


CHUNK = 5  # configurations per chunk at most: what Ctrl-C waits for, per worker


def chunks(jobs: Sequence[Any], size: int = CHUNK, largest_first: bool = False) -> list[list[tuple[int, Any]]]:
    """Jobs with their indices, grouped by (GPU, TP, KV dtype, weight dtype) in first-seen order,
    each group cut into chunks of at most ``size``; ``largest_first``: each group's jobs and then
    the chunks ordered by ``weight``, heaviest first (stable), so that a pool's workers do not
    wait on one long chunk at the end (the longest-processing-time-first rule)."""
    groups: dict[tuple, list[tuple[int, Any]]] = {}
    for i, job in enumerate(jobs):
        c = job.config
        groups.setdefault((c.gpu, c.tp, c.kv_cache_dtype, c.weight_dtype), []).append((i, job))
    if not largest_first:
        return [group[k : k + size] for group in groups.values() for k in range(0, len(group), size)]
    heavy = [sorted(group, key=lambda item: -weight(item[1].config)) for group in groups.values()]
    cut = [group[k : k + size] for group in heavy for k in range(0, len(group), size)]
    return sorted(cut, key=lambda chunk: -sum(weight(job.config) for _, job in chunk))


def weight(config: Any) -> int:
    """How much simulating ``config``'s capacity search costs, roughly: the requests it can hold in
    flight (``max_num_seqs``, times the decode workers of a disaggregated unit), which the largest
    probes run (kvplan.run.sim.search: concurrency up to that limit, 4 requests a user)."""
    return config.max_num_seqs * max(1, config.decode_workers)


def judge_chunk(chunk: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """Every job of ``chunk`` judged, with its index (what a pool worker or Ray task runs)."""
    return [(i, judge(job)) for i, job in chunk]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


class _StopOnCtrlC:
    """While active, Ctrl-C (SIGINT) sets ``asked`` instead of raising KeyboardInterrupt anywhere,
        so a result is never half-recorded or half-printed; the loops check it between waits. A second
    Ctrl-C raises KeyboardInterrupt as usual (quit now, keep nothing). Outside
        the main thread (where signals cannot be caught) it does nothing."""

    def __init__(self) -> None:
        self.asked = False
        self._before: Any = None

    def __enter__(self) -> _StopOnCtrlC:
        try:
            self._before = signal.signal(signal.SIGINT, self._ask)
        except ValueError:  # not the main thread
            self._before = None
        return self

    def _ask(self, signum: int, frame: Any) -> None:
        if self.asked:  # a second Ctrl-C: quit at once
            raise KeyboardInterrupt
        self.asked = True

    def __exit__(self, *exc: object) -> None:
        if self._before is not None:
            signal.signal(signal.SIGINT, self._before)


def run_jobs(
    jobs: Sequence[Any], workers: int = 1, ray: str | None = None, done: Callable[[Any], None] | None = None
) -> Outcome:
    """Judge every job here (``workers`` <= 1), on a pool of ``workers`` processes, or on the Ray
    cluster at ``ray`` ("local": a private Ray instance of ``workers`` CPUs for this search;
    "auto": the cluster ``RAY_ADDRESS`` or ``ray start`` names; or an address such as
    ``ray://head:10001``). ``done`` is called with each result as it finishes. Ctrl-C stops it:
    what is running finishes (here, on the pool) or is cancelled (Ray), what is pending is not
    started, and the outcome is ``interrupted``.

    Raises:
        KvplanError: ``ray``: Ray is not installed, or no cluster answers at the address.
    """
    outcome = Outcome([])

    def finished(part: list[tuple[int, Any]]) -> None:
        for item in part:
            outcome.done.append(item)
            if done:
                done(item[1])

    work = chunks(jobs, largest_first=ray is not None or workers > 1)  # one at a time: in grid order
    with _StopOnCtrlC() as stop:
        if ray is not None:
            _on_ray(work, ray, workers, finished, stop)
        elif workers <= 1:
            for item in (item for chunk in work for item in chunk):
                if stop.asked:
                    break
                finished(judge_chunk([item]))
        else:
            _on_pool(work, workers, finished, stop)
        outcome.interrupted = stop.asked and len(outcome.done) < len(jobs)
    return outcome


_POLL_S = 0.2  # how often a waiting loop looks at Ctrl-C


def _on_pool(work: list, workers: int, finished: Callable[[list], None], stop: _StopOnCtrlC) -> None:
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_ignore_sigint)
    try:
        _drain(pool, work, finished, stop)
    except BaseException:  # a second Ctrl-C: stop the workers now rather than wait for their chunks
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _drain(pool: ProcessPoolExecutor, work: list, finished: Callable[[list], None], stop: _StopOnCtrlC) -> None:
    """Submit every chunk and record each as it finishes; after Ctrl-C, cancel what has not
    started and record what was running when it finishes."""
    pending: set[Future] = {pool.submit(judge_chunk, chunk) for chunk in work}
    while pending:
        ready, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
        for future in ready:
            finished(future.result())
        if stop.asked:
            for future in pending:
                future.cancel()  # those not started; the running ones finish and are kept
            pending = {f for f in pending if not f.cancelled()}
            for future in wait(pending).done:
                finished(future.result())
            return


def _on_ray(work: list, address: str, workers: int, finished: Callable[[list], None], stop: _StopOnCtrlC) -> None:
    try:
        import ray
    except ImportError:
        raise KvplanError("ray", "Ray is not installed", RAY_HINT) from None
    import logging

    options: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    if address == "local":
        options.update(num_cpus=max(1, workers), include_dashboard=False)
    else:
        options["address"] = address
    try:
        ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise KvplanError(
            "ray",
            f"no Ray cluster answers at {address!r} ({first})",
            "start one (`ray start --head`) or give --ray local",
        ) from None
    try:
        task = ray.remote(num_cpus=1)(judge_chunk)
        pending = [task.remote(chunk) for chunk in work]
        while pending and not stop.asked:
            ready, pending = ray.wait(pending, num_returns=1, timeout=_POLL_S)
            for ref in ready:
                finished(ray.get(ref))
        for ref in pending:
            ray.cancel(ref, force=True)
    finally:
        ray.shutdown()


def search(
    jobs: Sequence[Job],
    workers: int = 1,
    done: Callable[[ConfigResult], None] | None = None,
    ray: str | None = None,
) -> tuple[list[ConfigResult], bool]:
    """Every job judged (``run_jobs``: here, on ``workers`` processes, or on the Ray cluster
    ``ray``), ranked by ``rank_key`` then by grid order, so the ranking is the same wherever they
    ran. ``done`` is called with each result as it finishes (progress). Returns the
    ranked results and whether Ctrl-C stopped the search (then only the finished ones)."""
    outcome = run_jobs(jobs, workers, ray, done)
    ranked = sorted(outcome.done, key=lambda item: (rank_key(item[1]), item[0]))
    return [r for _, r in ranked], outcome.interrupted
