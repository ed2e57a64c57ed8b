"""Decode runs (engine.decode_run) equal the engine's scheduler stepping one step at a
time: on random workloads (hypothesis, 200 of them) with preemption, chunked prefill, prefix
caching, prefill-first steps (SGLang's), closed and open loop, a server's front end (requests
reaching the scheduler some time after they arrive), multi-turn sessions with replayed replies
(later turns hit the cache on the blocks a run filled) and admission limits per tenant, every
step's stats, every finished request and the block manager's state at the end (cached hashes and
where they sit, the free queue's order, evictions) are the same with runs taken together and
without."""

from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.results.metrics import step_fields
from kvplan.results.records import LevelKey
from kvplan.results.run_result import EngineFacts
from kvplan.results.stats.steady import LevelSchedule, window_steps
from kvplan.results.stats.step_log import StepLog
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
    """Keeps what the backend reported: each step's stats as a dict, each finished request; and
    the steps as a capacity probe keeps them (``log``: decode runs as runs) and one by one."""

    def __init__(self, level: Level):
        super().__init__(self, level, lambda _: {})
        self.steps: list[dict] = []
        self.finished: list = []
        self.batches: list = []  # the steps of each advance, as reported
        self.pool: dict = {}
        self.log = StepLog()
        self.objects: list = []

    def record(self, finished, steps) -> None:
        self.batches.append(steps)
        self.log.extend(steps)
        self.objects += steps
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
        block_size, num_blocks, draw(st.integers(1, 8)), draw(st.integers(2, 64)), caching, draw(st.booleans())
    )  # prefill_first drawn too: SGLang's steps (--backend sglang)
    mode = draw(st.sampled_from(["closed", "open"]))
    value = draw(st.integers(1, 10)) if mode == "closed" else draw(st.sampled_from([50.0, 300.0, 2000.0]))
    plan = draw(st.sampled_from([None, LevelSchedule(num_requests=num, warmup_requests=2, cooldown_requests=3)]))
    lag = draw(st.sampled_from([0.0, 0.0, 7e-4, 3e-3, 2e-2]))  # less than, about and many steps
    return engine, requests, mode, value, plan, lag


@st.composite
def sessions(draw, shared: list[int]):
    """Multi-turn sessions: turn k + 1's prompt is turn k's prompt, its reply (replayed, shorter
    than max_tokens or as long) and new tokens, so later turns hit the blocks earlier turns
    filled, replies included; each session a tenant of two."""
    requests = []
    for session in range(draw(st.integers(1, 5))):
        prompt = shared + draw(st.lists(st.integers(0, 30), min_size=1, max_size=10))
        for turn in range(1, draw(st.integers(1, 3)) + 1):
            max_tokens = draw(st.integers(1, 30))
            reply = tuple(draw(st.lists(st.integers(0, 30), min_size=1, max_size=max_tokens)))
            requests.append(
                SampledRequest(
                    tuple(prompt), max_tokens, "random", reply_token_ids=reply, session=session, turn=turn,
                    think_time_s=draw(st.sampled_from([0.0, 1e-3])), tenant_name=f"t{session % 2}",
                )
            )  # fmt: skip
            prompt = prompt + list(reply) + draw(st.lists(st.integers(0, 30), min_size=1, max_size=6))
    return requests


ADMISSION = st.sampled_from(
    [
        None,
        {"tenant_max_concurrency": 1},
        {"tenant_max_concurrency": 2, "tenant_max_waiting": 3},
        {"max_num_waiting": 2},
        {"kv_admission_reserve": 0.2, "max_output_tokens": 12},
    ]
)


@st.composite
def cases(draw):
    """A workload of ``workloads`` (with ``sessions`` in place of its requests, half the time),
    and admission settings (None: off)."""
    engine, requests, mode, value, plan, lag = draw(workloads())
    if draw(st.booleans()):
        requests = draw(sessions(list(requests[0].prompt_token_ids[:3])))
        longest = max(r.num_tokens for r in requests)
        num_blocks = -(-longest // engine.block_size) * draw(st.integers(1, 4))
        engine = engine.model_copy(update={"num_blocks": num_blocks, "max_model_len": num_blocks * engine.block_size})
        plan = None
    else:
        requests = [replace(r, tenant_name=f"t{i % 2}") for i, r in enumerate(requests)]
    admission = draw(ADMISSION)
    if admission and "kv_admission_reserve" in admission and engine.num_blocks < 2:
        # a reserve of 0.2 leaves int(0.8 n) blocks: none of a 1-block pool, a setting the engine
        # refuses at start (engine/admission.py); 2 blocks leave 1
        engine = engine.model_copy(update={"num_blocks": 2, "max_model_len": 2 * engine.block_size})
    return engine, requests, mode, value, plan, lag, admission


class _StepByStepClock(ModelClock):
    """A clock without ``decode_times``: a run asks it step by step (as it asks a replayed run's)."""

    decode_times = None


def run(
    engine: EngineFacts,
    requests,
    mode,
    value,
    plan,
    lag,
    admission=None,
    *,
    decode_runs: bool,
    jitter=None,
    by_step: bool = False,
    residents: bool = True,
) -> _Capture:
    level = Level(LevelKey("b", mode, value, ""), 0, tuple(requests), plan)
    capture = _Capture(level)
    clock = (_StepByStepClock if by_step else ModelClock)(COST, lag, jitter=jitter)
    backend = SimBackend(engine, clock, decode_runs=decode_runs, admission=admission, residents=residents)
    run_level(backend, level, capture, seed=0)
    capture.pool = pool_state(backend)
    capture.batches = [len(steps) for steps in capture.batches]
    return capture


def pool_state(backend: SimBackend) -> dict:
    """What the block manager holds at the end: the prefix cache (hash -> block id), each block's
    hash and ref count, the free queue in order, evictions so far."""
    bm = backend.scheduler.block_manager
    bm.settle_deferred()  # every block's hash where a deferred one (engine.deferred_hashes) had none
    return {
        "cached": dict(bm._cached),
        "blocks": {b.block_id: (b.block_hash, b.ref_count) for b in bm.blocks.values()},
        "free": bm.free_queue(),
        "evictions": bm.num_evictions,
    }


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_decode_runs_equal_the_scheduler_step_by_step(case):
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps
    assert fast.finished == slow.finished
    assert fast.pool == slow.pool
    same_summaries(fast, slow)
    by_step = run(*case, decode_runs=True, by_step=True)  # the run's times asked of the clock step by step
    assert (by_step.steps, by_step.finished, by_step.pool) == (slow.steps, slow.finished, slow.pool)


def same_summaries(fast: _Capture, slow: _Capture) -> None:
    """A probe's summary read off its decode runs as columns (StepLog) equals the one read off
    the scheduler's steps one by one: the whole level, and windows cut at its steps' edges."""
    assert step_fields(fast.log) == step_fields(slow.objects)
    assert [asdict(s) for s in fast.log] == slow.steps
    if not slow.objects:
        return
    t0 = slow.objects[0].start_time
    edges = sorted({s.start_time - t0 for s in slow.objects} | {s.end_time - t0 for s in slow.objects})
    for window in (
        (edges[0], edges[-1]),
        (edges[len(edges) // 3], edges[2 * len(edges) // 3]),
        (edges[1:2] or edges)[:1] * 2,
    ):
        assert step_fields(window_steps(fast.log, t0, window)) == step_fields(window_steps(slow.objects, t0, window))


def test_runs_are_taken_with_prefix_caching_and_replies_and_fill_the_cache_as_steps_do():
    """Four sessions of two turns, the first turn replaying a 40-token reply, on 4-token blocks
    with prefix caching: the first turns decode together in runs (advance reports several steps
    at once), and each second turn finds in the cache every block its first turn filled (8 prompt
    tokens + 40 replayed, of which the last is never computed: 47 tokens, 11 full blocks of 4, 44
    tokens), exactly as stepping one by one finds them."""
    engine = facts(4, 200, 8, 64, True)
    requests = []
    for session in range(4):
        first = tuple(range(session * 8, session * 8 + 8))
        reply = tuple(100 + session * 40 + t for t in range(40))
        requests.append(SampledRequest(first, 40, "random", reply_token_ids=reply, session=session, turn=1))
        requests.append(SampledRequest(first + reply + (7,), 5, "random", session=session, turn=2))
    case = (engine, requests, "closed", 4, None, 0.0)
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps and fast.finished == slow.finished and fast.pool == slow.pool
    assert max(fast.batches) > 10 and max(slow.batches) == 1
    second_turns = [s for s in slow.steps if s["num_prefix_hit_tokens"]]
    assert sum(s["num_prefix_hit_tokens"] for s in second_turns) == 4 * 44


def test_a_long_decode_level_is_taken_in_runs():
    """256 requests decoding 200 tokens together: the runs cover most steps, and they are equal."""
    engine = facts(16, 4096, 256, 8192, False)
    requests = [SampledRequest(tuple(range(i % 50 + 10)), 200, "random") for i in range(256)]
    case = (engine, requests, "closed", 256, None, 0.0)
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps and fast.finished == slow.finished and fast.pool == slow.pool
    decode_only = sum(s["num_prefill_tokens"] == 0 for s in slow.steps)
    assert decode_only > 0.9 * len(slow.steps)


def test_a_jittered_clock_draws_the_same_residual_for_each_step_in_runs_as_step_by_step():
    """A server calibration's step jitter (kvplan.run.sim.cost.StepJitter, skewed like vLLM's on a
    CPU: most steps 5 ms short, a tenth up to 40 ms long) on a long decode level with a front end:
    the runs draw one residual per step, in step order, as stepping one by one does; each step
    lasts the cost model's seconds plus the level stream's next draw (at least 0), by hand."""
    from kvplan.run.sim.cost import StepJitter, StepWork

    jitter = StepJitter(tuple([-5e-3] * 90 + [i * 4e-3 for i in range(11)]))
    engine = facts(16, 4096, 64, 8192, False)
    requests = [SampledRequest(tuple(range(i % 50 + 10)), 120, "random") for i in range(64)]
    case = (engine, requests, "closed", 16, None, 2e-3)
    fast = run(*case, decode_runs=True, jitter=jitter)
    slow = run(*case, decode_runs=False, jitter=jitter)
    assert fast.steps == slow.steps and fast.finished == slow.finished and fast.pool == slow.pool
    assert max(fast.batches) > 10
    stream = jitter.stream(LevelKey("b", "closed", 16, "").id)
    for step in slow.steps:
        work = StepWork.of(SimpleNamespace(**step))
        want = max(COST.step_seconds(work) + jitter.draw(stream), 0.0)
        assert step["end_time"] - step["start_time"] == pytest.approx(want, abs=1e-12)
    plain = run(*case, decode_runs=True)
    assert sum(s["end_time"] - s["start_time"] for s in plain.steps) != pytest.approx(
        sum(s["end_time"] - s["start_time"] for s in fast.steps)
    )


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


def test_of_two_equal_blocks_the_one_filled_first_is_cached_as_step_by_step():
    """Two sessions under one salt whose first blocks hold the same tokens (5 7 7 7: A's prompt
    5 and its replayed 7s, B's prompt 5 7 7 and its first 7): after the first step B holds 3
    tokens and A 1, so in the decode run that follows B's block fills at its first step and A's
    at its third. The prefix cache keeps the first (B's block 1; A's, block 0, stays uncached
    as a duplicate), as stepping one by one does, though A was admitted first."""
    engine = facts(4, 64, 4, 64, True)
    sevens = (7,) * 20
    requests = [
        SampledRequest((5,), 20, "random", reply_token_ids=sevens, session=0, turn=1),
        SampledRequest((5, 7, 7), 20, "random", reply_token_ids=sevens, session=1, turn=1),
    ]
    case = (engine, requests, "closed", 2, None, 0.0)
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps and fast.finished == slow.finished
    assert max(fast.batches) > 2
    assert fast.pool == slow.pool
    cached = {block: h for h, block in slow.pool["cached"].items()}
    assert 1 in cached and 0 not in cached


def test_runs_with_requests_waiting_where_none_can_be_admitted():
    """Requests wait while the running ones decode: 6 users, 2 running at once (max_num_seqs)
    or 4 (their decodes take the whole 4-token budget, max_num_seqs 8); under prefill_first
    (SGLang's steps) a full budget admits nonetheless, since its prefill steps carry no decodes.
    Each way the runs equal stepping one by one, and some advance reports a run."""
    requests = [SampledRequest(tuple(range(i, i + 3)), 30, "random") for i in range(6)]
    for seqs, prefill_first in ((2, False), (2, True), (8, False), (8, True)):
        engine = facts(4, 400, seqs, 4, True, prefill_first)
        case = (engine, requests, "closed", 6, None, 0.0)
        fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
        assert fast.steps == slow.steps and fast.finished == slow.finished and fast.pool == slow.pool
        assert max(fast.batches) > 2, (seqs, prefill_first)
        assert any(s["num_waiting"] for s in slow.steps), (seqs, prefill_first)


def test_runs_while_a_preempted_request_waits_for_more_blocks_than_are_free():
    """4 users of a 3-token prompt and a 40-token reply on 30 blocks of 4 (each request ends
    holding 11): the pool runs out, the last admitted is preempted and waits, its 3 + n tokens
    needing a block more than are free while the others decode. Without prefix caching those
    steps go in runs (an advance reports several steps, each with the request waiting), equal to
    stepping one by one; with prefix caching (a block a run fills could shorten the waiting one's
    need) each is the scheduler's own."""
    requests = [SampledRequest(tuple(range(i, i + 3)), 40, "random") for i in range(4)]
    for caching in (False, True):
        case = (facts(4, 30, 8, 64, caching), requests, "closed", 4, None, 0.0)
        fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
        assert fast.steps == slow.steps and fast.finished == slow.finished and fast.pool == slow.pool
        assert sum(s["num_preemptions"] for s in slow.steps) >= 1
        at, waiting_runs = 0, 0
        for size in fast.batches:  # the steps of each advance, in order
            waiting_runs += size > 1 and all(s["num_waiting"] for s in fast.steps[at : at + size])
            at += size
        assert (waiting_runs > 0) == (not caching), caching


def test_a_run_that_evicts_the_hashes_its_own_blocks_fill_settles_step_by_step():
    """One user, two requests with the same prompt (3 tokens: no full block to hit) and the same
    20-token reply, on a pool of exactly the 6 blocks of 4 that the first one holds (23 tokens).
    The second reuses the first's freed blocks, tail first: as it grows it evicts the first's
    cached blocks 4, 3, 2, ... while its own blocks fill with those same hashes, so which of them
    the cache keeps depends on the order of the steps (a fill before its hash is evicted is a
    duplicate, one after is cached). The run settles these step by step: the cache, the free
    queue and the evictions equal stepping one by one."""
    engine = facts(4, 6, 1, 64, True)
    reply = tuple(range(100, 120))
    requests = [SampledRequest((1, 2, 3), 20, "random", reply_token_ids=reply, session=s, turn=1) for s in range(2)]
    case = (engine, requests, "closed", 1, None, 0.0)
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps and fast.finished == slow.finished and fast.pool == slow.pool
    assert max(fast.batches) > 2 and slow.pool["evictions"] > 0


def _taken_step_by_step(firsts: list[int], block_size: int, k: int) -> tuple[list[int], list[int]]:
    """The blocks a run's ``k`` steps take, found as the run's loop once found them: step by step,
    the requests due a block in admission order, each due again ``block_size`` steps later."""
    due: dict[int, list[int]] = {}
    for i, f in enumerate(firsts):
        due.setdefault(f, []).append(i)
    steps, who = [], []
    for j in range(k):
        grow = sorted(due.pop(j, ()))
        steps += [j] * len(grow)
        who += grow
        due.setdefault(j + block_size, []).extend(grow)
    return steps, who


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 16), st.data())
def test_the_blocks_a_run_takes_come_in_the_order_its_steps_take_them(block_size, data):
    """engine.decode_run's ``_taken`` (a stretch of block_size steps at a time where every request
    is due within the first, else sorted) and ``_num_taken`` against the steps one by one, first
    steps past block_size included (a table holding more than its tokens need)."""
    from engine.decode_run import _num_taken, _taken

    top = data.draw(st.sampled_from([block_size - 1, 2 * block_size + 3]))  # the common case, or any
    firsts = data.draw(st.lists(st.integers(0, top), min_size=1, max_size=12))
    k = data.draw(st.integers(1, 6 * block_size + 5))
    assert _taken(firsts, block_size, k) == _taken_step_by_step(firsts, block_size, k)
    steps = _taken_step_by_step(firsts, block_size, k)[0]
    assert [_num_taken(firsts, block_size, j) for j in range(k)] == [sum(s <= j for s in steps) for j in range(k)]
