"""Searching load levels in simulation: the exact knee, and the highest load within the SLO.

Every probe is one level of a bucket simulated on a fresh ``SimBackend`` through the load test's
own driver (kvplan.load.driver.run_level), its records kept in memory and summarised by the load
test's metrics, so a probe is exactly the level a load test or ``kvplan simulate`` would run.

- Knee: no request holds more than ``B`` blocks (its prompt + output - 1 tokens), so ``c``
  requests in flight fit a pool of ``N`` blocks whenever ``c x B <= N`` and the knee is above
  ``N // B``; levels from ``N // B + 1`` up are simulated until one preempts (each stops at its
  first preemption).
- SLO: the highest concurrency in [1, num_requests] and the highest Poisson request rate whose
  SLO attainment (the fraction of the level's requests meeting every SLO) is at least the target
  (in a shared_prefix workload with the prefixes shared, the ``cached`` variant; the knee, as the
  load test's summary, with nothing shared).
  Attainment falls as load grows, so both are found by bisection (concurrency exactly; the rate
  by doubling or halving from the request rate the highest good concurrency serves, then to
  within ``RATE_PRECISION``). When even all of the bucket's requests at once (concurrency
  num_requests) meet it, no rate is too high for them: ``burst_meets_slo``, and no rate is searched;
  when not even concurrency 1 does, no rate does either (at a rate low enough that requests never
  meet, each runs alone, as at concurrency 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvplan.load.driver import Level, Recorder, run_level
from kvplan.load.requests import SampledRequest
from kvplan.load.sim.backend import SimBackend
from kvplan.load.sim.cost import FixedStepCost, ModelClock, StepClock
from kvplan.load.workload import Workload
from kvplan.results.metrics import LevelSummary, Slo, summarize_level
from kvplan.results.prefix_metrics import CACHED, UNCACHED
from kvplan.results.records import LevelKey, Mode, RequestRecord, StepRecord
from kvplan.results.run_result import EngineFacts, RunEstimate
from kvplan.results.simulated import BucketCapacity, SloPoint

RATE_PRECISION = 1.02  # the rate search stops when the bracket is within 2 %
_MAX_RATE_STEPS = 24
_NO_SIZES = {"ideal_bytes": 0, "paged_bytes": 0, "contiguous_bytes": 0, "measured_bytes": 0}


class _Preempted(Exception):
    pass


class _Records(Recorder):
    """A Recorder that keeps a probe's records in memory: its requests as RequestRecords, its steps
    as the scheduler's own StepStats (what the level's summary reads of a step, without the KV
    sizes a report draws); raises _Preempted at a preempting step when asked to."""

    def __init__(self, level: Level, stop_on_preemption: bool):
        super().__init__(self, level, lambda _: _NO_SIZES)
        self.requests: list[RequestRecord] = []
        self.steps: list[Any] = []
        self.stop = stop_on_preemption

    def write_request(self, record) -> None:
        self.requests.append(record)

    def write_step(self, record: StepRecord) -> None:
        raise NotImplementedError("record() keeps the steps as they are and writes none")

    def record(self, finished, steps) -> None:
        if self.stop and any(s.num_preemptions for s in steps):
            raise _Preempted
        self.steps += steps
        super().record(finished, ())


class Prober:
    """Simulates single levels of a workload's buckets on ``facts`` with clocks from ``clock``."""

    def __init__(
        self,
        workload: Workload,
        facts: EngineFacts,
        clock: Callable[[], StepClock],
        sampled: dict[str, list[SampledRequest]],
    ):
        self.workload, self.facts, self.clock, self.sampled = workload, facts, clock, sampled
        shared = workload.shared_prefix is not None
        # the knee as the load test's summary takes it, with nothing shared; the SLO with the
        # prefixes shared as the workload's tenants would share them
        self.knee_variant, self.slo_variant = (UNCACHED, CACHED) if shared else ("", "")

    def level(
        self,
        bucket_index: int,
        mode: Mode,
        value: int | float,
        stop_on_preemption: bool = False,
        variant: str | None = None,
    ) -> LevelSummary | None:
        """The summary of one simulated level (None: it preempted and ``stop_on_preemption``);
        ``variant`` of a shared_prefix workload: the knee's by default."""
        bucket = self.workload.buckets[bucket_index]
        key = LevelKey(bucket.name, mode, value, self.knee_variant if variant is None else variant)
        level = Level(key, bucket_index, tuple(self.sampled[bucket.name]))
        records = _Records(level, stop_on_preemption)
        try:
            run_level(SimBackend(self.facts, self.clock()), level, records, self.workload.seed)
        except _Preempted:
            return None
        return summarize_level(key, records.requests, records.steps, self.workload.slo, bucket.num_requests)

    def knee(self, bucket_index: int) -> int | None:
        """The lowest concurrency that preempts (see the module docstring); None up to num_requests."""
        requests = self.sampled[self.workload.buckets[bucket_index].name]
        block = self.facts.block_size
        most = max(-(-(r.num_tokens - 1) // block) for r in requests)
        for concurrency in range(self.facts.num_blocks // most + 1, len(requests) + 1):
            if self.level(bucket_index, "closed", concurrency, stop_on_preemption=True) is None:
                return concurrency
        return None

    def capacity(self, bucket_index: int, attainment: float, knee: int | None) -> BucketCapacity:
        """The bucket's SLO answers at ``attainment`` (0-1), with its ``knee`` (found apart: it needs
        no timing)."""
        name = self.workload.buckets[bucket_index].name
        if not _has_slo(self.workload.slo):
            return BucketCapacity(name=name, knee=knee)
        probes: dict[tuple[str, float], LevelSummary] = {}

        def probe(mode: Mode, value: float) -> LevelSummary:
            if (mode, value) not in probes:
                summary = self.level(bucket_index, mode, value, variant=self.slo_variant)
                assert summary is not None  # None only with stop_on_preemption
                probes[mode, value] = summary
            return probes[mode, value]

        def meets(mode: Mode, value: float) -> bool:
            return (probe(mode, value).slo_attainment or 0.0) >= attainment

        num_requests = len(self.sampled[name])
        concurrency = _highest_int(lambda c: meets("closed", c), num_requests)
        if concurrency == num_requests:  # all at once meets it: so does any rate of these requests
            return BucketCapacity(
                name=name, knee=knee, max_concurrency=_point(probe("closed", concurrency)), burst_meets_slo=True
            )
        if concurrency is None:  # one at a time misses it: so does a rate low enough to never queue
            return BucketCapacity(name=name, knee=knee)
        # the rate the highest good concurrency sustains is near the highest good rate: start there
        start = probe("closed", concurrency or 1).requests_per_s or 1.0
        rate = _highest_rate(lambda r: meets("open", r), start)
        return BucketCapacity(
            name=name,
            knee=knee,
            max_concurrency=_point(probe("closed", concurrency)) if concurrency else None,
            max_request_rate=_point(probe("open", rate)) if rate else None,
        )


def _has_slo(slo: Slo) -> bool:
    return any(v is not None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms))


def _point(summary: LevelSummary) -> SloPoint:
    return SloPoint(
        level=summary.level,
        slo_attainment=summary.slo_attainment or 0.0,
        output_tokens_per_s=summary.output_tokens_per_s,
        goodput_rps=summary.goodput_rps,
    )


def _highest_int(ok: Callable[[int], bool], top: int) -> int | None:
    """The highest n in [1, top] with ok(n), by bisection (ok assumed to hold below some n): top
    first, the common answer on a GPU with room to spare, and the cheapest level to simulate."""
    if ok(top):
        return top
    if top == 1 or not ok(1):
        return None
    low, high = 1, top
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def _highest_rate(ok: Callable[[float], bool], start: float) -> float | None:
    """The highest rate with ok(rate), to within RATE_PRECISION, from ``start`` (requests/s).
    Rates are rounded to 4 significant digits, the way a workload would name them."""
    rnd = lambda r: float(f"{r:.4g}")  # noqa: E731
    rate = rnd(start)
    if ok(rate):
        low, high = rate, None
        for _ in range(_MAX_RATE_STEPS):
            if not ok(rnd(low * 2)):
                high = rnd(low * 2)
                break
            low = rnd(low * 2)
        if high is None:
            return low
    else:
        high, low = rate, None
        for _ in range(_MAX_RATE_STEPS):
            if ok(rnd(high / 2)):
                low = rnd(high / 2)
                break
            high = rnd(high / 2)
        if low is None:
            return None
    assert low is not None and high is not None  # each branch returned where one stayed None
    while high / low > RATE_PRECISION:
        mid = rnd((low * high) ** 0.5)
        if mid in (low, high):
            break
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def knee_clock() -> StepClock:
    """The clock of knee searches: any will do, closed-loop scheduling ignores time."""
    return ModelClock(FixedStepCost())


def simulated_knees(
    workload: Workload, facts: EngineFacts, sampled: dict[str, list[SampledRequest]]
) -> dict[str, int | None]:
    """Bucket name -> its simulated knee (no timing needed: closed-loop admission and preemption
    depend on token counts and free blocks only)."""
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
    sampled: dict[str, list[SampledRequest]],
    clock: Callable[[], StepClock],
    attainment: float,
    knees: dict[str, int | None],
) -> list[BucketCapacity]:
    """Every bucket's SLO answers on ``facts`` timed by ``clock``, with its knee from ``knees``."""
    prober = Prober(workload, facts, clock, sampled)
    return [prober.capacity(i, attainment, knees.get(b.name)) for i, b in enumerate(workload.buckets)]


def levels_around(knee: int | None, num_requests: int) -> list[int]:
    """``concurrency: auto``: 1 and the levels around the knee (knee - 2 .. knee + 1) within
    [1, num_requests], so the measured knee comes out at single-request resolution; without a
    knee, 1 and num_requests."""
    if knee is None:
        return sorted({1, num_requests})
    return sorted({c for c in (1, knee - 2, knee - 1, knee, knee + 1) if 1 <= c <= num_requests})
