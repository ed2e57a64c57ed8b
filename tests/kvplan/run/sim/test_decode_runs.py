"""Decode runs (kvplan.run.sim.decode_run) equal the engine's scheduler stepping one step at a
time: on random workloads (hypothesis, 200 of them) with preemption, chunked prefill, prefix
caching, prefill-first steps (SGLang's), closed and open loop, and a server's front end (requests
reaching the scheduler some time after they arrive), every step's stats and every finished
request are the same with runs taken together and without."""

from dataclasses import asdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.results.records import LevelKey
from kvplan.results.run_result import EngineFacts
from kvplan.results.stats.steady import LevelSchedule
from kvplan.run.driver import Level, Recorder, run_level
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.calibration.fit import LinearStepCost
from kvplan.run.sim.cost import ModelClock
from kvplan.traffic.requests import SampledRequest

# a cost that depends on every feature, so a step's time says what it computed
COST = LinearStepCost(
    intercept_s=1e-3,
    coefficients={
        "num_prefill_tokens": 2e-5,
        "num_decode_tokens": 3e-5,
        "num_prefill_seqs": 1e-4,
        "num_context_tokens": 1e-6,
        "num_attended_tokens": 1e-8,
    },  # fmt: skip
    gap_s=2e-4,
)


class _Capture(Recorder):
    """Keeps what the backend reported: each step's stats as a dict, each finished request."""

    def __init__(self, level: Level):
        super().__init__(self, level, lambda _: {})
        self.steps: list[dict] = []
        self.finished: list = []

    def record(self, finished, steps) -> None:
        self.steps += [asdict(s) for s in steps]
        self.finished += finished
        for out in finished:
            self.submitted.pop(out.request_id)


def facts(
    block_size: int, num_blocks: int, max_num_seqs: int, budget: int, caching: bool, prefill_first: bool = False
) -> EngineFacts:
    return EngineFacts(
        model="simulated", device="cpu", dtype="float32", kv_cache_dtype="fp32", attention_backend="torch",
        block_size=block_size, num_blocks=num_blocks, bytes_per_block=1, max_model_len=num_blocks * block_size,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, enable_prefix_caching=caching, seed=0,
        prefill_first=prefill_first,
    )  # fmt: skip


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    caching = draw(st.booleans())
    num = draw(st.integers(1, 12))
    shared = draw(st.lists(st.integers(0, 30), min_size=0, max_size=6))  # a common prefix: cache hits
    requests = []
    for _ in range(num):
        own = draw(st.lists(st.integers(0, 30), min_size=1, max_size=14))
        requests.append(SampledRequest(tuple(shared + own), draw(st.integers(1, 40)), "random"))
    longest = max(r.num_tokens for r in requests)
    num_blocks = draw(st.integers(-(-longest // block_size), -(-longest // block_size) * 4))  # tight pools preempt
    engine = facts(
        block_size, num_blocks, draw(st.integers(1, 8)), draw(st.integers(8, 64)), caching, draw(st.booleans())
    )  # prefill_first drawn too: SGLang's steps (--backend sglang)
    mode = draw(st.sampled_from(["closed", "open"]))
    value = draw(st.integers(1, 10)) if mode == "closed" else draw(st.sampled_from([50.0, 300.0, 2000.0]))
    plan = draw(st.sampled_from([None, LevelSchedule(num_requests=num, warmup_requests=2, cooldown_requests=3)]))
    lag = draw(st.sampled_from([0.0, 0.0, 7e-4, 3e-3, 2e-2]))  # less than, about and many steps
    return engine, requests, mode, value, plan, lag


def run(engine: EngineFacts, requests, mode, value, plan, lag, decode_runs: bool) -> _Capture:
    level = Level(LevelKey("b", mode, value, ""), 0, tuple(requests), plan)
    capture = _Capture(level)
    run_level(SimBackend(engine, ModelClock(COST, lag), decode_runs=decode_runs), level, capture, seed=0)
    return capture


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_decode_runs_equal_the_scheduler_step_by_step(case):
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps
    assert fast.finished == slow.finished


def test_a_long_decode_level_is_taken_in_runs():
    """256 requests decoding 200 tokens together: the runs cover most steps, and they are equal."""
    engine = facts(16, 4096, 256, 8192, False)
    requests = [SampledRequest(tuple(range(i % 50 + 10)), 200, "random") for i in range(256)]
    case = (engine, requests, "closed", 256, None, 0.0)
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps and fast.finished == slow.finished
    decode_only = sum(s["num_prefill_tokens"] == 0 for s in slow.steps)
    assert decode_only > 0.9 * len(slow.steps)


def test_a_front_end_delays_a_request_to_the_next_step_boundary_after_it_reaches_the_scheduler():
    """Hand arithmetic, 10 ms steps, a 15 ms front end. A alone: reaches the idle scheduler at
    15 ms, prefills 15-25 ms. B, sent at 25 ms when A's first token comes, reaches the scheduler at
    40 ms, mid-way through A's decode step of 35-45 ms: it is prefilled 45-55 ms (TTFT 30 ms, where
    without the front end it would join the step at 25 ms: TTFT 10 ms)."""
    from kvplan.run.driver import Submission
    from kvplan.run.sim.cost import FixedStepCost

    backend = SimBackend(facts(4, 64, 4, 64, False), ModelClock(FixedStepCost(0.01), 0.015))
    backend.submit(Submission("b/closed/2/0", (1, 2, 3), 6, 0, "s", 0.0))
    _, steps = backend.advance(None)
    assert [(s.start_time, s.end_time) for s in steps] == [(0.015, 0.025)]
    backend.submit(Submission("b/closed/2/1", (4, 5, 6), 2, 0, "s", backend.now()))
    ends = []
    while len(ends) < 4:
        finished, steps = backend.advance(None)
        ends += [(round(s.end_time, 9), s.num_prefill_tokens, s.num_decode_tokens) for s in steps]
    assert ends[:3] == [(0.035, 0, 1), (0.045, 0, 1), (0.055, 3, 1)]
