"""Where ``kvplan plan``'s configurations are judged: here, on a process pool over this machine's
cores, or as Ray tasks on a cluster (``--ray``). The answers are the same everywhere: each
configuration is simulated whole by one worker from the same job (kvplan.optimize.plan.judge,
which is deterministic), so only the wall time differs.

A worker's setup for a GPU kind (aiconfigurator-core's database and engine for its system, about
1.2-1.6 s on a 2-core Xeon, kept per process: kvplan.sizing.gpus.silicon) is paid once per
process and GPU kind, so work goes out by GPU kind: on Ray in chunks of one GPU kind, TP and
dtypes; on a process pool one configuration at a time, a worker handed the next configuration of
the GPU kind it last judged while that kind has any left, else one of a kind no other worker is
on (the most work left first), heaviest configurations first (``Affinity``); a worker gets the
jobs once, at its start, and then each job as its index. Ctrl-C stops the
search and keeps what finished: pending work is not started (a pool lets what is running finish,
Ray cancels it), and the caller gets the finished results with ``interrupted`` set.
"""

from __future__ import annotations

import signal
from collections import Counter
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


class Affinity:
    """The order a pool's workers take the jobs in, one job at a time: ``next(last)`` gives the
    heaviest job left (by ``weight``, ties in grid order) of GPU kind ``last`` (what the asking
    worker judged last, so its setup for that kind is reused), and when that kind has none left
    (or ``last`` is None), the heaviest of the kind with the most weight left among the kinds no
    worker is on now, or of all kinds left when every one has a worker. ``done(kind)`` says a
    worker finished a job of that kind. The answers do not depend on the order (each job is
    judged whole and alone); only the setups paid and the pool's idle time do."""

    def __init__(self, jobs: Sequence[Any]):
        self.jobs = jobs
        self.left: dict[str, list[tuple[int, Any]]] = {}
        for i, job in enumerate(jobs):
            self.left.setdefault(job.config.gpu, []).append((i, job))
        for group in self.left.values():
            group.sort(key=lambda item: -weight(item[1].config))  # stable: ties in grid order
        self.on: Counter[str] = Counter()  # GPU kind -> workers judging one of its jobs now

    def next(self, last: str | None) -> tuple[int, Any] | None:
        """The next job for a worker that last judged GPU kind ``last`` (None: none yet), or None
        when every job has been handed out."""
        kind = last if last is not None and self.left.get(last) else None
        if kind is None:
            open_kinds = [k for k, group in self.left.items() if group]
            if not open_kinds:
                return None
            free = [k for k in open_kinds if not self.on[k]] or open_kinds
            kind = max(free, key=lambda k: sum(weight(job.config) for _, job in self.left[k]))  # first of ties
        self.on[kind] += 1
        return self.left[kind].pop(0)

    def done(self, kind: str) -> None:
        """A worker finished a job of GPU kind ``kind``."""
        self.on[kind] -= 1


def judge_chunk(chunk: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """Every job of ``chunk`` judged, with its index (what a pool worker or Ray task runs); the
    step times asked kept on disk (kvplan.sizing.gpus.silicon_memo: a worker has no atexit)."""
    from kvplan.sizing.gpus.silicon_memo import keep_step_times

    judged = [(i, judge(job)) for i, job in chunk]
    keep_step_times()
    return judged


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


_JOBS: Sequence[Any] = ()  # a pool worker's copy of the jobs (given once, at its start)


def _start_worker(jobs: Sequence[Any]) -> None:
    """A pool worker's start: Ctrl-C left to the parent, and the jobs kept, so that each job is
    then sent as its index (the jobs' shared requests go to a worker once, not once a job)."""
    global _JOBS
    _ignore_sigint()
    _JOBS = jobs


def _judge_index(i: int) -> list[tuple[int, Any]]:
    return judge_chunk([(i, _JOBS[i])])


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

    with _StopOnCtrlC() as stop:
        if ray is not None:
            _on_ray(chunks(jobs, largest_first=True), ray, workers, finished, stop)
        elif workers <= 1:  # one at a time: in grid order
            for item in enumerate(jobs):
                if stop.asked:
                    break
                finished(judge_chunk([item]))
        else:
            _on_pool(Affinity(jobs), workers, finished, stop)
        outcome.interrupted = stop.asked and len(outcome.done) < len(jobs)
    return outcome


_POLL_S = 0.2  # how often a waiting loop looks at Ctrl-C


def _on_pool(work: Affinity, workers: int, finished: Callable[[list], None], stop: _StopOnCtrlC) -> None:
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_start_worker, initargs=(work.jobs,))
    try:
        _drain(pool, work, workers, finished, stop)
    except BaseException:  # a second Ctrl-C: stop the workers now rather than wait for their chunks
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _drain(
    pool: ProcessPoolExecutor, work: Affinity, workers: int, finished: Callable[[list], None], stop: _StopOnCtrlC
) -> None:
    """Keep ``workers`` jobs in flight, one a worker: as one finishes, record it and hand out the
    next (``work.next`` of its GPU kind: the worker now idle is the one that takes it, so it keeps
    its setup); after Ctrl-C hand out nothing more and record what was running when it finishes."""
    running: dict[Future, str] = {}

    def hand_out(last: str | None) -> None:
        item = work.next(last)
        if item is not None:
            running[pool.submit(_judge_index, item[0])] = item[1].config.gpu

    for _ in range(workers):
        hand_out(None)
    while running:
        ready = wait(running, timeout=_POLL_S, return_when=FIRST_COMPLETED).done
        for future in ready:
            kind = running.pop(future)
            work.done(kind)
            finished(future.result())
            if not stop.asked:
                hand_out(kind)
        if stop.asked:
            for future in wait(running).done:
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
