"""Searching load levels in simulation: the exact knee, and the highest load within the SLO.

Every probe is one level of a bucket simulated on a fresh ``SimBackend`` through the load test's
own driver (kvplan.run.driver.run_level), its records kept in memory and summarised by the load
test's metrics, so a probe is exactly the level a load test or ``kvplan simulate`` would run.

- Knee: no request holds more than ``B`` blocks (its prompt + output - 1 tokens), so ``c``
  requests in flight fit a pool of ``N`` blocks whenever ``c x B <= N``: ``N // B`` never
  preempts. Nor does any concurrency above ``max_num_seqs`` when ``max_num_seqs`` does not: the
  scheduler runs at most that many, admits the waiting ones in the same order, and without a
  preemption makes the same decisions. So the knee is searched in (``N // B``, ``max_num_seqs``]
  by bisection between a level that does not preempt and one that does, and the knee reported is
  a concurrency that preempts while the one below it does not. Where the onset of preemption is
  monotone in concurrency (the tests check it against the exhaustive scan) that is the lowest
  concurrency that preempts. Each probe stops at its first preemption and runs the bucket's
  requests, cycled to ``KNEE_ROUNDS`` per user where the bucket has fewer.
- SLO: the highest concurrency and the highest Poisson request rate whose SLO attainment (the
  fraction of the measured requests meeting every SLO) is at least the target (in a shared_prefix
  workload with the prefixes shared, the ``cached`` variant; the knee, as the load test's summary,
  with nothing shared). Each probe is a steady-state level (kvplan.results.stats.steady): ``u``
  requests of warm-up, then ``max(num_requests, STEADY_ROUNDS x min(u, max_num_seqs))`` measured,
  then ``u`` of cool-down, the bucket's requests cycled (past ``max_num_seqs`` the extra users
  only wait, so 4 per running slot); ``u`` is the concurrency, or for a rate the users it keeps in
  flight by Little's law (rate x the mean E2E latency at the highest good concurrency, at most
  ``max_num_seqs``). So each user sends ``STEADY_ROUNDS`` measured requests, the window is long
  against one request's E2E, and the answer no longer depends on the bucket's size. Attainment
  falls as load grows, so both are found by bisection (concurrency in [1, ``max_num_seqs``] to
  within ``CONCURRENCY_PRECISION``, and when even ``max_num_seqs`` users meet it, on past it,
  where more users only wait in the queue, by doubling up to ``MAX_USERS x max_num_seqs`` and
  bisection, or that limit first where Little's law predicts the queue leaves the SLO's TTFT and
  E2E bounds 1.5 times the P95 there, ``queue_cannot_bind``; the rate by doubling or halving from
  the request rate the highest good concurrency serves, up to the saturation rate, what
  ``max_num_seqs`` in flight serve, since past it the queue grows without bound; then to within
  ``RATE_PRECISION``; where more users than ``max_num_seqs`` (a queue) meet the SLO, the saturation
  rate is asked first, the answer when it meets). The lowest level seen failing above each answer
  is kept (``above_concurrency``, ``above_request_rate``), so the edge shows; an answer at a limit
  says so (``concurrency_bound: max_num_seqs``, ``request_rate_bound: saturation``).
  ``burst_meets_slo`` (no rate is too high) only when the SLO holds at the scheduler's own limit
  and bounds no latency that a growing queue raises (TPOT only: neither TTFT nor E2E). When not
  even concurrency 1 meets it, no rate does either (at a rate low enough that requests never meet,
  each runs alone, as at concurrency 1).

The knee and concurrency searches are steered (kvplan.run.sim.brackets.steered): they simulate
the levels where the edge is expected (kvplan.run.sim.edges: the pool's arithmetic, the probes'
scores, Little's law) and infer the rest by monotonicity, with the plain searches' answers where
it holds. The rate search is not: 2 % apart, rates (with their own warm-up) are not monotone.

A trace bucket's probes, knee and SLO alike, run a sample of at most 1,000 of its requests
(kvplan.run.sim.trace_sample); its replay level (kvplan.run.driver) runs every request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvplan.results.metrics import LevelSummary, Slo, meets_slo, summarize_level
from kvplan.results.records import LevelKey, Mode, RequestRecord, StepRecord
from kvplan.results.run_result import EngineFacts, RunEstimate
from kvplan.results.simulated import BucketCapacity, SloPoint
from kvplan.results.stats.prefix_metrics import CACHED, UNCACHED
from kvplan.results.stats.steady import LevelSchedule, request_index
from kvplan.results.stats.step_log import StepLog
from kvplan.run.driver import Level, Recorder, run_level
from kvplan.run.sim.ahead import Probes
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.brackets import beyond, bisect, highest_int, highest_rate, inside, round_rate, steered
from kvplan.run.sim.cost import FixedStepCost, ModelClock, StepClock
from kvplan.run.sim.edges import expected_edge, expected_knee, in_waves, queue_cannot_bind, score, slo_ratio
from kvplan.run.sim.trace_sample import probe_sample
from kvplan.traffic.requests import SampledRequest
from kvplan.workload.schema import Workload

CONCURRENCY_PRECISION = 1.02  # and the concurrency search within 2 % (or one user)
STEADY_ROUNDS = 4  # a capacity probe measures at least 4 requests per user (see the module docstring)
KNEE_ROUNDS = 2  # a knee probe runs at least 2 requests per user
BOUND = "max_num_seqs"  # what bounds a max_concurrency that meets the SLO at the scheduler's limit
MAX_USERS = 8  # the concurrency search stops at 8 x max_num_seqs users
MAX_USERS_BOUND = "max_users"  # what bounds a max_concurrency that meets the SLO even there
SATURATION = "saturation"  # what bounds a max_request_rate that meets the SLO at what max_num_seqs serve
_NO_SIZES = {"ideal_bytes": 0, "paged_bytes": 0, "contiguous_bytes": 0, "measured_bytes": 0}


class _Preempted(Exception):
    pass


class _Decided(Exception):
    """A capacity probe's measured requests already miss the SLO too often to meet the target."""


class _Records(Recorder):
    """A Recorder that keeps a probe's records in memory: its requests as RequestRecords, its steps
    as the scheduler reports them (kvplan.results.stats.step_log.StepLog: StepStats, and decode runs
    read as columns; what the level's summary reads of a step, without the KV sizes a report
    draws); raises _Preempted at a preempting step when asked to, and _Decided once more than
    ``(1 - attainment) x num_requests`` measured requests of ``plan`` missed ``slo``."""

    def __init__(
        self,
        level: Level,
        stop_on_preemption: bool,
        slo: Slo | None = None,
        attainment: float | None = None,
        class_slos: dict[str, Slo] | None = None,
    ):
        super().__init__(self, level, lambda _: _NO_SIZES)
        self.class_slos = class_slos or {}  # a mix class judged by its own SLO
        self.requests: list[RequestRecord] = []
        self.steps = StepLog()  # decode runs kept as runs: the summary reads them as columns
        self.stop = stop_on_preemption
        plan = level.plan
        self.decide = slo is not None and attainment is not None and plan is not None and plan.duration_s is None
        if slo is not None and plan is not None and attainment is not None and self.decide:
            self.slo, self.first = slo, plan.warmup_requests
            self.last, self.allowed = plan.warmup_requests + plan.num_requests, (1 - attainment) * plan.num_requests
            self.misses = 0
        self.ratios: list[float] = []  # the measured requests' SLO ratios (kvplan.run.sim.edges)

    def write_request(self, record) -> None:
        self.requests.append(record)
        if self.decide and self.first <= request_index(record) < self.last:
            slo = self.class_slos.get(record.request_class, self.slo)
            self.ratios.append(slo_ratio(record, slo))
            if not meets_slo(record, slo):
                self.misses += 1
                if self.misses > self.allowed:
                    raise _Decided

    def write_step(self, record: StepRecord) -> None:
        raise NotImplementedError("record() keeps the steps as they are and writes none")

    def record(self, finished, steps) -> None:
        before = self.steps.num_preemptions
        self.steps.extend(steps)
        if self.stop and self.steps.num_preemptions > before:
            raise _Preempted
        super().record(finished, ())


class Prober:
    """Simulates single levels of a workload's buckets on ``facts`` with clocks from ``clock``."""

    def __init__(
        self,
        workload: Workload,
        facts: EngineFacts,
        clock: Callable[[], StepClock],
        sampled: Mapping[str, Sequence[SampledRequest]],
        make_backend: Callable[[], Any] | None = None,
        ahead: bool | Callable[[], bool] = False,
    ):
        self.workload, self.facts, self.clock, self.sampled = workload, facts, clock, sampled
        # a disaggregated target's backends (kvplan.run.sim.disagg); two probes side by side (.ahead)
        self.make_backend, self.ahead = make_backend, ahead
        shared = workload.shared_prefix is not None
        # the knee as the load test's summary takes it, with nothing shared; the SLO with the
        # prefixes shared as the workload's tenants would share them
        self.knee_variant, self.slo_variant = (UNCACHED, CACHED) if shared else ("", "")
        self.scores: dict[tuple[int, str, float], float] = {}  # a capacity probe's (kvplan.run.sim.edges)

    def level(
        self,
        bucket_index: int,
        mode: Mode,
        value: int | float,
        stop_on_preemption: bool = False,
        variant: str | None = None,
        plan: LevelSchedule | None = None,
        decide: float | None = None,
        offsets: tuple[float, ...] | None = None,
    ) -> LevelSummary | None:
        """The summary of one simulated level (None: it preempted and ``stop_on_preemption``);
        ``variant`` of a shared_prefix workload: the knee's by default; ``plan``: a steady-state
        probe's (None: the bucket's requests once, as a load test's level); ``decide``: an
        attainment target at which a probe with a plan stops as soon as too many of its measured
        requests missed the SLO to meet it (its summary then covers the requests finished so far,
        and its attainment is below the target; with ``decide`` or ``stop_on_preemption``, no ITL nor step
        fields: ``summarize_level``'s ``latencies_only``); ``offsets``: a trace's arrival offsets, s, for an
        open level replayed at them (kvplan.traffic.trace)."""
        bucket = self.workload.buckets[bucket_index]
        key = LevelKey(bucket.name, mode, value, self.knee_variant if variant is None else variant)
        requests = tuple(self.sampled[bucket.name])
        sessions = bool(requests) and requests[0].session is not None
        if sessions:  # a session level runs each of its sessions once (kvplan.run.session_loop)
            plan = None
        level = Level(key, bucket_index, requests, plan, bucket.arrival, offsets=offsets)
        slos = self.workload.class_slos.get(bucket.name)
        records = _Records(level, stop_on_preemption, self.workload.slo, decide, slos)
        try:
            admit = self.workload.engine.admission.model_dump()  # no KV residents: a probe reads none
            new = self.make_backend or (lambda: SimBackend(self.facts, self.clock(), admission=admit, residents=False))
            run_level(new(), level, records, self.workload.seed)
        except _Preempted:
            return None
        except _Decided:  # summarised from the requests finished so far: its attainment is below target
            pass
        if decide is not None:
            self.scores[bucket_index, mode, value] = score(records.ratios, decide)
        planned = len(requests) if sessions else bucket.num_requests if plan is None else plan.num_requests
        lean, slo = decide is not None or stop_on_preemption, self.workload.slo  # lean: a search's probe
        return summarize_level(key, records.requests, records.steps, slo, planned, plan, slos, latencies_only=lean)

    def preempts(self, bucket_index: int, concurrency: int) -> bool:
        """Whether ``concurrency`` in flight preempts: a closed-loop level of the bucket's requests,
        cycled to ``KNEE_ROUNDS`` per user where the bucket has fewer, stopped at its first
        preemption."""
        num = len(self.sampled[self.workload.buckets[bucket_index].name])
        plan = None if num >= KNEE_ROUNDS * concurrency else LevelSchedule(num_requests=KNEE_ROUNDS * concurrency)
        return self.level(bucket_index, "closed", concurrency, stop_on_preemption=True, plan=plan) is None

    def knee(self, bucket_index: int) -> int | None:
        """The knee (see the module docstring): None when max_num_seqs in flight never preempt."""
        requests = self.sampled[self.workload.buckets[bucket_index].name]
        block = self.facts.block_size
        most = max(-(-(r.num_tokens - 1) // block) for r in requests)
        low, high = self.facts.num_blocks // most, self.facts.max_num_seqs  # low never preempts
        if low >= high or not self.preempts(bucket_index, high):
            return None
        edge, known = expected_knee(requests, self.facts.num_blocks, block), {low: True, high: False}
        fits = lambda c: not self.preempts(bucket_index, c)  # noqa: E731
        # bisection between low (does not preempt) and high (does), steered by the pool's arithmetic
        return steered(lambda ok: bisect(ok, low, high, 1.0), fits, known, lambda: inside(edge, known))[1]

    def steady(self, users: int, bucket_index: int, rate: float | None = None) -> LevelSchedule:
        """A capacity probe's plan: ``users`` requests of warm-up and of cool-down around
        ``STEADY_ROUNDS`` per user measured (per running slot past max_num_seqs users, where the
        rest only wait; at least the bucket's num_requests); at a ``rate``,
        also enough to arrive over ``STEADY_ROUNDS`` times the SLO's longest latency bound (TTFT or
        E2E), so that a queue growing past saturation outgrows the SLO within the window (at most
        twice the count without it)."""
        num = len(self.sampled[self.workload.buckets[bucket_index].name])
        measured = max(num, STEADY_ROUNDS * min(users, self.facts.max_num_seqs))
        slo = self.workload.slo
        horizon_s = max((v for v in (slo.ttft_ms, slo.e2e_ms) if v is not None), default=0.0) / 1e3
        if rate is not None:  # at most twice the closed-loop count (a loose SLO needs no more)
            measured = max(measured, min(math.ceil(rate * STEADY_ROUNDS * horizon_s), 2 * measured))
        return LevelSchedule(num_requests=measured, warmup_requests=users, cooldown_requests=users)

    def capacity(
        self, bucket_index: int, attainment: float, knee: int | None, precision: float = CONCURRENCY_PRECISION
    ) -> BucketCapacity:
        """The bucket's SLO answers at ``attainment`` (0-1), with its ``knee`` (found apart: it needs
        no timing); the concurrency to within ``precision`` (a ratio, or one user)."""
        name, slo, top = self.workload.buckets[bucket_index].name, self.workload.slo, self.facts.max_num_seqs
        if all(v is None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms)):
            return BucketCapacity(name=name, knee=knee)

        def simulate(mode: Mode, value: float) -> tuple[LevelSummary, float | None]:
            # an open level's warm-up: the users its rate keeps in flight (Little's law), <= the limit
            n = int(value) if mode == "closed" else min(top, max(1, round(value * e2e_s)))
            plan = self.steady(n, bucket_index, value if mode == "open" else None)
            summary = self.level(bucket_index, mode, value, variant=self.slo_variant, plan=plan, decide=attainment)
            assert summary is not None  # None only with stop_on_preemption
            return summary, self.scores.get((bucket_index, mode, value))

        probes = Probes(simulate, self.scores, bucket_index, self.ahead)  # kvplan.run.sim.ahead
        probe = probes.probe
        known: dict[str, dict[float, bool]] = {"closed": {}, "open": {}}  # level -> meets the SLO

        def meets(mode: Mode, value: float) -> bool:
            known[mode][value] = (probe(mode, value).slo_attainment or 0.0) >= attainment
            return known[mode][value]

        def steer(mode: Mode, search: Callable[[Callable], tuple]) -> tuple:
            """``search``'s answer, steered by the edge the levels so far suggest (brackets.steered)."""
            levels, scores = known[mode], self.scores

            def guess() -> float | None:
                ratio = {v: scores.get((bucket_index, mode, v), math.nan) for v in levels}
                summaries = {v: probes[mode, v] for v in levels}
                waves = in_waves(self.sampled[name])  # requests of one length (kvplan.run.sim.edges)
                return expected_edge(levels, ratio, summaries, slo, top if mode == "closed" else None, waves)

            ahead = lambda ends: probes.both((mode, ends[0]), (mode, ends[1]))  # noqa: E731
            return steered(search, lambda v: meets(mode, v), levels, guess, ahead=ahead)

        e2e_s = 0.0
        concurrency, above_c = steer("closed", lambda ok: highest_int(ok, top, precision))
        queue_bound = slo.ttft_ms is not None or slo.e2e_ms is not None
        if concurrency == top and queue_bound:
            # users past max_num_seqs wait in the queue: doubling to where the wait breaks the SLO (at most
            # MAX_USERS x max_num_seqs); where it cannot predictably bind, that limit first (if it meets, all below do)
            cap = MAX_USERS * top
            if queue_cannot_bind(probe("closed", top), cap - top, slo) and meets("closed", cap):
                concurrency, above_c = cap, None
            else:
                concurrency, above_c = steer("closed", lambda ok: beyond(ok, top, cap, precision))
        if concurrency is None:  # one at a time misses it: so does a rate low enough to never queue
            return BucketCapacity(name=name, knee=knee, above_concurrency=_point(probe("closed", 1)))
        best = probe("closed", concurrency)
        e2e_s = (best.e2e_ms.mean / 1e3) if best.e2e_ms is not None else 0.0
        # saturation: what max_num_seqs in flight serve, requests/s; past it the queue grows without bound
        saturation = round_rate(probe("closed", top).requests_per_s or best.requests_per_s or 1.0)
        if concurrency == top and not queue_bound:
            # only TPOT bound: a growing queue never breaks it, so no rate is too high
            return BucketCapacity(
                name=name, knee=knee, max_concurrency=_point(best), burst_meets_slo=True, concurrency_bound=BOUND
            )
        start = best.requests_per_s or 1.0  # what the best concurrency sustains, near the best rate: start there
        first = round_rate(min(start, saturation))  # the rates it asks first: side by side
        # a queue behind max_num_seqs busy meets the SLO: so likely does the saturation rate, the answer if so
        top_first = concurrency > top and first < saturation
        asks = (saturation, first) if top_first else (first, min(round_rate(2 * first), saturation))
        probes.both(("open", asks[0]), ("open", asks[1]))
        # not steered: at 2 % apart, rates are not monotone enough (their warm-up and count differ)
        rate, above_r = highest_rate(lambda r: meets("open", r), start, top=saturation, top_first=top_first)
        return BucketCapacity(
            name=name,
            knee=knee,
            max_concurrency=_point(best),
            concurrency_bound=None if above_c is not None else BOUND if concurrency == top else MAX_USERS_BOUND,
            max_request_rate=_point(probe("open", rate)) if rate else None,
            request_rate_bound=SATURATION if rate == saturation else None,
            above_concurrency=_point(probe("closed", above_c)) if above_c is not None else None,
            above_request_rate=_point(probe("open", above_r)) if above_r is not None else None,
        )


def _point(summary: LevelSummary) -> SloPoint:
    return SloPoint(
        level=summary.level,
        slo_attainment=summary.slo_attainment or 0.0,
        output_tokens_per_s=summary.output_tokens_per_s,
        goodput_rps=summary.goodput_rps,
        ttft_p99_ms=None if summary.ttft_ms is None else summary.ttft_ms.p99,
        tpot_p99_ms=None if summary.tpot_ms is None else summary.tpot_ms.p99,
    )


def knee_clock() -> StepClock:
    """The clock of knee searches: any will do, closed-loop scheduling ignores time."""
    return ModelClock(FixedStepCost())


def simulated_knees(
    workload: Workload, facts: EngineFacts, sampled: Mapping[str, Sequence[SampledRequest]]
) -> dict[str, int | None]:
    """Bucket name -> its simulated knee (no timing needed: closed-loop admission and preemption
    depend on token counts and free blocks only); a trace's on ``probe_sample``'s requests."""
    workload, sampled = probe_sample(workload, sampled)
    prober = Prober(workload, facts, knee_clock, sampled)
    return {b.name: prober.knee(i) for i, b in enumerate(workload.buckets)}


def with_knees(estimate: RunEstimate, knees: dict[str, int | None]) -> RunEstimate:
    """``estimate`` with each bucket's simulated knee filled in."""
    return estimate.model_copy(
        update={"buckets": [b.model_copy(update={"simulated_knee": knees.get(b.name)}) for b in estimate.buckets]}
    )


def resolve_auto(workload: Workload, facts: EngineFacts, sampled: dict[str, list[SampledRequest]]) -> Workload:
    """``workload`` with every ``concurrency: auto`` replaced by the levels around its bucket's
    simulated knee (``levels_around``); the same workload when none is auto."""
    if not any(b.concurrency == "auto" for b in workload.buckets):
        return workload
    knees = simulated_knees(workload, facts, sampled)
    buckets = [
        b.model_copy(update={"concurrency": levels_around(knees[b.name], b.num_requests)})
        if b.concurrency == "auto"
        else b
        for b in workload.buckets
    ]
    resolved = workload.model_copy(update={"buckets": buckets})
    resolved._source, resolved._sha256, resolved._warnings = workload.source, workload.sha256, workload.warnings
    return resolved


def search_capacity(
    workload: Workload,
    facts: EngineFacts,
    sampled: Mapping[str, Sequence[SampledRequest]],
    clock: Callable[[], StepClock],
    attainment: float,
    knees: dict[str, int | None],
    precision: float = CONCURRENCY_PRECISION,
    make_backend: Callable[[], Any] | None = None,
    trace_sample: bool = True,
    ahead: bool | Callable[[], bool] = False,
) -> list[BucketCapacity]:
    """Every bucket's SLO answers on ``facts`` timed by ``clock`` (or on ``make_backend``'s fresh
    backends: a disaggregated target), with its knee from ``knees`` (the concurrency to within
    ``precision``); a trace's on ``probe_sample``'s requests (``trace_sample`` False: on all given);
    ``ahead``: two probes side by side where the search asks two in a row (kvplan.run.sim.ahead;
    a callable: where it says so at that moment)."""
    if trace_sample:
        workload, sampled = probe_sample(workload, sampled)
    prober = Prober(workload, facts, clock, sampled, make_backend, ahead)
    return [prober.capacity(i, attainment, knees.get(b.name), precision) for i, b in enumerate(workload.buckets)]


def levels_around(knee: int | None, num_requests: int) -> list[int]:
    """``concurrency: auto``: 1 and the levels around the knee (knee - 2 .. knee + 1) within
    [1, num_requests], so the measured knee comes out at single-request resolution; without a
    knee, 1 and num_requests."""
    if knee is None:
        return sorted({1, num_requests})
    return sorted({c for c in (1, knee - 2, knee - 1, knee, knee + 1) if 1 <= c <= num_requests})
