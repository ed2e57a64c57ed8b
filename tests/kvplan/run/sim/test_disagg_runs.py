"""Decode runs on a disaggregated target's decode workers (kvplan.run.sim.disagg.DisaggBackend._run)
equal the workers stepping one step at a time: on random disaggregated workloads (hypothesis, 150
of them) with 1-3 prefill and 1-3 decode workers, tight decode pools (handoffs waiting for blocks,
preemption), small max_num_seqs (handoffs waiting for a slot), slow and fast links, a gap between
steps or none, token 1 from either pool, closed and open loop, every finished request (token times,
transfer seconds), every worker's steps and each pool's blocks at the end are the same with runs
taken and without."""

from bisect import bisect_left
from dataclasses import asdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.results.records import LevelKey
from kvplan.results.run_result import EngineFacts
from kvplan.results.stats.steady import LevelSchedule
from kvplan.run.driver import Level, Recorder, run_level
from kvplan.run.sim.calibration.fit import LinearStepCost
from kvplan.run.sim.cost import ModelClock
from kvplan.run.sim.disagg import DisaggBackend, _Worker
from kvplan.sizing.gpus.links import Link
from kvplan.traffic.requests import SampledRequest

FEATURES = {
    "num_prefill_tokens": 2e-5,
    "num_decode_tokens": 3e-5,
    "num_prefill_seqs": 1e-4,
    "num_context_tokens": 1e-6,
    "num_attended_tokens": 1e-8,
}  # every feature priced, so a step's time says what it computed


class _Capture(Recorder):
    def __init__(self, level: Level):
        super().__init__(self, level, lambda _: {})
        self.finished: list = []
        self.calls = 0

    def record(self, finished, steps) -> None:
        assert steps == []  # a disaggregated backend keeps its steps per worker
        self.calls += 1
        self.finished += finished
        for out in finished:
            self.submitted.pop(out.request_id)


def facts(block_size: int, num_blocks: int, max_num_seqs: int, budget: int) -> EngineFacts:
    return EngineFacts(
        model="simulated", device="cpu", dtype="float32", kv_cache_dtype="fp32", attention_backend="torch",
        block_size=block_size, num_blocks=num_blocks, bytes_per_block=1, max_model_len=num_blocks * block_size,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, enable_prefix_caching=False, seed=0,
    )  # fmt: skip


@st.composite
def cases(draw):
    block_size = draw(st.sampled_from([1, 4, 16]))
    requests = [
        SampledRequest(
            tuple(draw(st.lists(st.integers(0, 30), min_size=1, max_size=40))), draw(st.integers(1, 60)), "random"
        )
        for _ in range(draw(st.integers(1, 14)))
    ]
    longest = max(r.num_tokens for r in requests) + 1  # token 1 from decode: one slot more
    least = -(-longest // block_size)
    prefill = facts(block_size, draw(st.integers(least, least * 4)), draw(st.integers(1, 6)), draw(st.integers(8, 64)))
    decode = facts(block_size, draw(st.integers(least, least * 3)), draw(st.integers(1, 6)), 64)
    pools = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    link = Link("t", bytes_per_s=draw(st.sampled_from([1e3, 1e5, 1e7])), setup_s=draw(st.sampled_from([0.0, 1e-3])))
    gap = draw(st.sampled_from([0.0, 0.0, 2e-4]))
    first = draw(st.sampled_from(["prefill", "decode"]))
    mode = draw(st.sampled_from(["closed", "open"]))
    value = draw(st.integers(1, 12)) if mode == "closed" else draw(st.sampled_from([50.0, 300.0, 2000.0]))
    plan = draw(
        st.sampled_from([None, LevelSchedule(num_requests=len(requests), warmup_requests=2, cooldown_requests=3)])
    )
    return requests, prefill, decode, pools, link, gap, first, mode, value, plan


def run(requests, prefill, decode, pools, link, gap, first, mode, value, plan, *, decode_runs: bool):
    """(the capture, the backend) of one level run on fresh pools."""
    clock = lambda: ModelClock(LinearStepCost(1e-3, FEATURES, gap))  # noqa: E731
    backend = DisaggBackend(
        (prefill, clock, pools[0]),
        (decode, clock, pools[1]),
        link,
        lambda n: 10.0 * n,
        first_token=first,
        decode_runs=decode_runs,
    )
    level = Level(LevelKey("b", mode, value, ""), 0, tuple(requests), plan)
    capture = _Capture(level)
    run_level(backend, level, capture, seed=0)
    return capture, backend


def state(backend: DisaggBackend) -> list:
    """Every worker's steps (as dicts) and its pool at the end: blocks used, the free queue."""
    return [
        (
            [asdict(s) for s in w.steps],
            w.scheduler.block_manager.num_used_blocks,
            w.scheduler.block_manager.free_queue(),
        )
        for w in (*backend.prefill, *backend.decode)
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_decode_runs_on_a_disaggregated_target_equal_its_workers_step_by_step(case):
    (fast, fast_backend), (slow, slow_backend) = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.finished == slow.finished
    assert state(fast_backend) == state(slow_backend)


def test_a_decode_pool_full_of_long_replies_is_taken_in_runs():
    """2 prefill and 2 decode workers, 4 slots a decode worker, 24 users of 200-token replies: the
    decode workers stay full with handoffs waiting, so their steps go in runs (far fewer advances),
    and the answers are the same."""
    requests = [SampledRequest(tuple(range(i % 7 + 20)), 200, "random") for i in range(24)]
    case = (
        requests,
        facts(16, 64, 8, 256),
        facts(16, 64, 4, 256),
        (2, 2),
        Link("t", bytes_per_s=1e6, setup_s=1e-4),
        0.0,
        "prefill",
        "closed",
        24,
        None,
    )
    (fast, fast_backend), (slow, slow_backend) = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.finished == slow.finished and state(fast_backend) == state(slow_backend)
    decode_steps = sum(len(w.steps) for w in slow_backend.decode)
    assert decode_steps > 24 * 200 / 8  # at most 8 decode at once over the two workers
    assert fast.calls < slow.calls / 5


def test_a_decode_worker_runs_while_its_prefill_worker_idles_and_a_handoff_cuts_its_run():
    """1 prefill and 1 decode worker with room to spare (8 slots, 3 users of 200-token replies):
    the prefill worker is idle between requests, and any moment a request could arrive and be
    handed off. The decode worker's steps still go in runs (far fewer advances), timed ahead and
    cut where a handoff arrives (the step starting at or after it admits it), each going on to the
    step that finishes requests (fewer decode steps taken alone than requests), equal to stepping."""
    requests = [SampledRequest(tuple(range(i % 5 + 20)), 200, "random") for i in range(6)]
    case = (
        requests,
        facts(16, 64, 8, 256),
        facts(16, 128, 8, 256),
        (1, 1),
        Link("t", bytes_per_s=1e6, setup_s=1e-4),
        0.0,
        "prefill",
        "closed",
        3,
        None,
    )
    cuts, starts = [], []
    take_run, start = _Worker.take_run, DisaggBackend._start

    def spy(worker, before=None):
        if worker.pending is not None and before is not None:
            cuts.append(bisect_left(worker.pending[0].starts, before) < len(worker.pending[0].ends))
        take_run(worker, before)

    def stepped(backend, worker, at):
        starts.append(worker in backend.decode)
        start(backend, worker, at)

    _Worker.take_run, DisaggBackend._start = spy, stepped
    try:
        (fast, fast_backend) = run(*case, decode_runs=True)
        decode_steps_alone, starts[:] = sum(starts), []
        (slow, slow_backend) = run(*case, decode_runs=False)
    finally:
        _Worker.take_run, DisaggBackend._start = take_run, start
    assert fast.finished == slow.finished and state(fast_backend) == state(slow_backend)
    assert fast.calls < slow.calls / 5
    assert any(cuts)  # a pending run was cut short by a handoff
    # a run goes on to the step that finishes requests: fewer decode steps alone than finishes
    assert decode_steps_alone < len(requests) < sum(starts)
