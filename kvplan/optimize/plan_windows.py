"""``kvplan plan --window S``: a trace's traffic sized window by window, a static deployment against
one that follows the load.

::

    trace (dataset kind trace) -> windows of S s from its first arrival; a window's rate is its
      arrivals / S req/s (a last window cut short by the trace's end still counts S s)
    -> the grid judged on the busiest window's own requests at its rate (kvplan.optimize.plan:
       the ranking, and what a static deployment sized for the peak costs per configuration)
    -> the best configuration judged again on every window's own requests at that window's rate:
       its SLO capacity per replica on those requests (their lengths and prefix reuse, not
       averages), replicas = ceil(rate / capacity), at least 1 (a window without arrivals: 1)
    -> static: the most replicas any window needs, all along; following: each window's replicas
       for its S s, a scale-up paid ``scale_up_s`` s early at its new count (the new replicas
       must be up when the window starts), a scale-down free at the window's start

The capacity search cycles a window's requests (kvplan.run.sim.search), so a window of many
arrivals is judged on at most ``window_requests`` of them, evenly spaced in arrival order (all
of them when fewer). Costs: $ = replicas x tp x $/GPU-hour x hours; over the trace's windows
(count x S s). Every window is an independent job, run here, on the process pool or on Ray as
the grid is (kvplan.optimize.plan_pool).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.optimize import plan as planning
from kvplan.results.plan_result import ConfigResult, WindowPlan, WindowResult
from kvplan.traffic.requests import SampledRequest
from kvplan.workload.schema import Workload
from kvplan.workload.trace import Trace, TraceRequest

DEFAULT_SCALE_UP_S = 300.0  # an assumption, stated and settable (--scale-up-s): a replica's start and model load
DEFAULT_WINDOW_REQUESTS = 300  # requests per window the capacity search cycles at most
MAX_WINDOWS = 10_000  # a year of hours is 8,760: more windows is a typo of the window's unit, not a plan


@dataclass(frozen=True)
class TraceWindow:
    """One window: ``index`` (0-based), ``start_s`` from the trace's first arrival, the 0-based
    positions of its arrivals in the trace (``lines``), and its rate = len(lines) / window, req/s."""

    index: int
    start_s: float
    lines: tuple[int, ...]
    rate: float


def split_windows(trace: Trace, window_s: float) -> list[TraceWindow]:
    """The trace's arrivals in windows of ``window_s`` s from its first arrival, every window up to
    the last arrival's (empty ones included), in time order.

    Raises:
        KvplanError: ``window`` not a finite number > 0 s; longer than the trace's span (first to
            last arrival: no window is whole, and its rate, arrivals / S, would be diluted by the
            time past the trace's end); or so short that the trace holds over ``MAX_WINDOWS``.
    """
    if not (window_s > 0 and math.isfinite(window_s)):
        raise KvplanError("window", f"must be a finite number of seconds > 0 (got {window_s:g})", "e.g. --window 3600")
    first = trace.requests[0].offset_s
    span = trace.requests[-1].offset_s - first
    if window_s > span:
        raise KvplanError(
            "window",
            f"{window_s:g} s is longer than the trace's {span:g} s (its first to last arrival): no window is"
            " whole, and a window's rate counts all its seconds",
            (f"give a window <= {span:g} s, or" if span > 0 else "all arrive at once:")
            + " leave out `window` and give `rate`",
        )
    if span / window_s >= MAX_WINDOWS:
        raise KvplanError(
            "window",
            f"{window_s:g} s cuts the trace's {span:g} s into over {MAX_WINDOWS:,} windows, each judged by simulation",
            f"give a window >= {span / (MAX_WINDOWS - 1):.3g} s",
        )
    bins: list[list[int]] = []
    for i, r in enumerate(trace.requests):
        k = int((r.offset_s - first) // window_s)
        while len(bins) <= k:
            bins.append([])
        bins[k].append(i)
    return [TraceWindow(k, k * window_s, tuple(b), len(b) / window_s) for k, b in enumerate(bins)]


def judged_lines(lines: Sequence[int], cap: int) -> tuple[int, ...]:
    """At most ``cap`` of ``lines``, evenly spaced (position ``j * n // cap``), in their order."""
    n = len(lines)
    if n <= cap:
        return tuple(lines)
    return tuple(lines[j * n // cap] for j in range(cap))


def busiest(windows: Sequence[TraceWindow]) -> TraceWindow:
    """The window with the most arrivals (the earliest of equals)."""
    return max(windows, key=lambda w: (len(w.lines), -w.index))


def window_result(window: TraceWindow, judged: int, result: ConfigResult | None) -> WindowResult:
    """A window's answer from its judged configuration (None: the window has no arrivals, 1 replica)."""
    if result is None:
        return WindowResult(
            index=window.index,
            start_s=window.start_s,
            num_requests=0,
            judged_requests=0,
            rate=0.0,
            slo_max_request_rate=None,
            replicas=1,
            meets_slo=True,
        )
    return WindowResult(
        index=window.index,
        start_s=window.start_s,
        num_requests=len(window.lines),
        judged_requests=judged,
        rate=window.rate,
        slo_max_request_rate=result.slo_max_request_rate,
        replicas=None if result.replicas is None else max(1, result.replicas),
        meets_slo=result.meets_slo,
    )


def costs(
    replicas: Sequence[int], tp: int, usd_per_gpu_hour: float | None, window_s: float, scale_up_s: float
) -> tuple[float | None, float | None]:
    """(static $, following $) over ``len(replicas)`` windows of ``window_s`` s (module docstring):
    static = max(replicas) x tp x $/GPU-h x total hours; following = sum of replicas_w x tp x $/GPU-h
    x window hours + sum of max(0, replicas_w - replicas_(w-1)) x tp x $/GPU-h x scale_up_s hours
    (the first window starts provisioned). None for both when unpriced."""
    if usd_per_gpu_hour is None or not replicas:
        return None, None
    per_replica_s = tp * usd_per_gpu_hour / 3600.0
    static = max(replicas) * per_replica_s * window_s * len(replicas)
    ups = sum(max(0, b - a) for a, b in zip(replicas, replicas[1:], strict=False))
    following = (sum(replicas) * window_s + ups * scale_up_s) * per_replica_s
    return static, following


def window_plan(
    best: ConfigResult,
    windows: Sequence[TraceWindow],
    judged: Sequence[int],
    results: dict[int, ConfigResult],
    window_s: float,
    scale_up_s: float,
    usd_per_gpu_hour: float | None,
) -> WindowPlan:
    """The per-window answers of ``best`` (``results`` by window index; a window missing from it has
    no arrivals) with the static and following costs (``costs``; both None when a window cannot
    meet the SLO). ``judged``: requests judged per window, by position."""
    rows = [window_result(w, judged[k], results.get(w.index)) for k, w in enumerate(windows)]
    counts = [r.replicas for r in rows]
    met = all(c is not None for c in counts)
    static, following = (None, None)
    if met:
        static, following = costs([c or 0 for c in counts], best.tp, usd_per_gpu_hour, window_s, scale_up_s)
    return WindowPlan(
        window_s=window_s,
        scale_up_s=scale_up_s,
        gpu=best.gpu,
        tp=best.tp,
        windows=rows,
        static_replicas=max(c or 0 for c in counts) if met else None,
        static_usd=static,
        following_usd=following,
        usd_per_gpu_hour=usd_per_gpu_hour,
    )


def best_config(best: ConfigResult) -> planning.Config:
    """The grid configuration of a judged result (a replica: ``--window`` refuses ``--disagg``),
    its host KV tier included."""
    return planning.Config(
        best.gpu,
        best.tp,
        best.kv_cache_dtype,
        best.weight_dtype,
        best.max_num_seqs,
        best.max_num_batched_tokens,
        host_offload_gib=best.host_offload_gib or 0.0,
    )


def _counted(workload: Workload, bucket: int, count: int) -> Workload:
    """``workload`` with bucket ``bucket`` measuring ``count`` requests per probe."""
    buckets = list(workload.buckets)
    buckets[bucket] = buckets[bucket].model_copy(update={"num_requests": count})
    return workload.model_copy(update={"buckets": buckets})


class WindowRequests(Mapping[str, list[SampledRequest]]):
    """A window's judged requests under its bucket's name, built from their trace lines each time
    they are read (kvplan.traffic.trace.trace_requests: the same requests as a replay of the whole
    trace), so a job carries a few numbers per request to its worker, not its token ids, and no
    process holds more than the windows it is judging."""

    def __init__(self, workload: Workload, name: str, lines: tuple[TraceRequest, ...], vocab_size: int):
        self.workload, self.name, self.lines, self.vocab_size = workload, name, lines, vocab_size

    def __getitem__(self, name: str) -> list[SampledRequest]:
        if name != self.name:
            raise KeyError(name)
        from kvplan.traffic.trace import trace_requests

        return trace_requests(self.workload, Trace(self.lines), self.vocab_size, range(len(self.lines)))

    def __iter__(self) -> Iterator[str]:
        return iter((self.name,))

    def __len__(self) -> int:
        return 1


class TraceWindows:
    """A trace workload's windows, their judged requests, and the jobs that size them.

    ``busiest_spec``, ``busiest`` and ``busiest_rate`` are what the grid is judged on (the
    workload measuring the busiest window's judged requests, those requests by bucket name, its
    rate in req/s); ``judge`` sizes the best configuration on every window.

    Raises (at construction):
        KvplanError: ``window``: the workload's dataset is not a trace, or a bad window length.
    """

    def __init__(self, workload: Workload, bucket: int, vocab_size: int, window_s: float, cap: int, model: str):
        from kvplan.workload.trace import read_trace

        trace = read_trace(workload)
        if trace is None:
            raise KvplanError(
                "window",
                "sizes a trace window by window, and the workload's dataset is not a trace",
                "give a workload with dataset: {kind: trace, path: FILE}",
            )
        self.workload, self.bucket, self.model, self.window_s = workload, bucket, model, window_s
        self.windows = split_windows(trace, window_s)
        self.lines = [judged_lines(w.lines, cap) for w in self.windows]
        name = workload.buckets[bucket].name
        self.requests = {
            w.index: WindowRequests(workload, name, tuple(trace.requests[i] for i in self.lines[k]), vocab_size)
            for k, w in enumerate(self.windows)
            if w.lines
        }
        top = busiest(self.windows)
        self.busiest_spec = _counted(workload, bucket, len(self.lines[top.index]))
        self.busiest = self.requests[top.index]
        self.busiest_rate = top.rate

    @property
    def jobs(self) -> list[TraceWindow]:
        """The windows that are judged (those with arrivals)."""
        return [w for w in self.windows if w.lines]

    def judge(
        self,
        best: ConfigResult,
        attainment: float,
        scale_up_s: float,
        price: tuple[float, str] | None,
        workers: int,
        ray: str | None,
        done: Callable[[ConfigResult], None] | None = None,
    ) -> tuple[WindowPlan, bool]:
        """``best`` sized on every window with arrivals (here, on ``workers`` processes or on Ray, as
        the grid), and the costs (``window_plan``); returns it and whether Ctrl-C cut it short
        (then the windows not judged read as unmet).

        ``best`` is the grid's answer for its configuration on the busiest window (``busiest_spec``,
        ``busiest``, ``busiest_rate``, the same attainment and price): that window's job would be
        the same job (kvplan.optimize.plan.judge is deterministic), so ``best`` is its answer, not
        simulated again. The rest go out the heaviest first (the most judged requests, then the
        highest rate; a pool hands out one job at a time, ties of ``weight`` in this order: plan_pool.Affinity),
        so a pool's workers end together."""
        from kvplan.optimize.plan_pool import run_jobs

        config = best_config(best)
        top = busiest(self.windows).index
        windows = sorted(
            (w for w in self.jobs if w.index != top),  # the grid judged exactly ``config`` on the busiest
            key=lambda w: (-len(self.lines[w.index]), -w.rate, w.index),
        )
        jobs = [
            planning.Job(
                _counted(self.workload, self.bucket, len(self.lines[w.index])),
                self.model,
                self.bucket,
                config,
                self.requests[w.index],
                w.rate,
                None,
                attainment,
                price,
            )
            for w in windows
        ]
        results: dict[int, ConfigResult] = {}
        results[top] = best
        if done:
            done(best)
        outcome = run_jobs(jobs, workers, ray, done)
        results.update({windows[i].index: r for i, r in outcome.done})
        for w in self.jobs:  # cut short: a window not judged cannot be said to meet the SLO
            results.setdefault(w.index, _unjudged(best))
        judged = [len(lines) for lines in self.lines]
        usd = None if price is None else price[0]
        return window_plan(best, self.windows, judged, results, self.window_s, scale_up_s, usd), outcome.interrupted


def _unjudged(best: ConfigResult) -> ConfigResult:
    return best.model_copy(update={"replicas": None, "meets_slo": False, "slo_max_request_rate": None})
