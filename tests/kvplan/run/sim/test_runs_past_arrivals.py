"""Decode runs taken past arrivals (kvplan.run.sim.backend: while ``max_num_seqs`` requests run,
an arrival only joins the queue, so the run is taken whole and handed over in parts, each with
the queue's length of its steps) equal the scheduler stepping one step at a time: on open-loop
workloads whose arrivals come during long decodes with the scheduler full (hypothesis), every
step's stats, every finished request, the pool and the summaries. By hand: a level whose runs
are handed over in parts, the parts' queue lengths counted."""

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import kvplan.run.sim.backend as backend_module
from kvplan.results.records import LevelKey
from kvplan.results.stats.steady import LevelSchedule
from kvplan.run.driver import Level, run_level
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.cost import ModelClock
from kvplan.traffic.requests import SampledRequest
from tests.kvplan.run.sim.test_decode_runs import COST, _Capture, facts, pool_state, same_summaries


def run(engine, requests, mode, value, plan, gap_s, *, decode_runs: bool) -> _Capture:
    """test_decode_runs.run on a clock with ``gap_s`` between steps (a GPU target's have none)."""
    level = Level(LevelKey("b", mode, value, ""), 0, tuple(requests), plan)
    capture = _Capture(level)
    backend = SimBackend(engine, ModelClock(replace(COST, gap_s=gap_s)), decode_runs=decode_runs)
    run_level(backend, level, capture, seed=0)
    capture.pool = pool_state(backend)
    return capture


@st.composite
def busy(draw):
    """Open-loop levels of long outputs at rates that bring arrivals during most runs, with a
    ``max_num_seqs`` of 1-3 that the requests fill."""
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    requests = [
        SampledRequest(
            tuple(draw(st.lists(st.integers(0, 30), min_size=1, max_size=10))), draw(st.integers(8, 60)), "random"
        )
        for _ in range(draw(st.integers(3, 12)))
    ]
    longest = -(-max(r.num_tokens for r in requests) // block_size)
    num_blocks = draw(st.integers(longest, longest * 6))  # tight pools preempt
    engine = facts(
        block_size,
        num_blocks,
        draw(st.integers(1, 3)),
        draw(st.integers(4, 64)),
        draw(st.booleans()),
        draw(st.booleans()),
    )
    rate = draw(st.sampled_from([300.0, 1000.0, 3000.0]))  # a step lasts about 1.1 ms (test_decode_runs.COST)
    plan = draw(
        st.sampled_from([None, LevelSchedule(num_requests=len(requests), warmup_requests=2, cooldown_requests=3)])
    )
    return engine, requests, "open", rate, plan, draw(st.sampled_from([0.0, 0.0, 2e-4]))  # a gap: not taken past


_OWN_AHEAD_PART = backend_module.SimBackend._ahead_part  # the unwrapped method, taken once


class Parts:
    """Counts the parts runs taken past arrivals were handed over in (and those with more to come).
    It wraps the method as the module found it, not whatever is patched in now: hypothesis runs many
    examples under one ``monkeypatch``, and wrapping the last wrapper nested one more call per
    example (the fuzz profile's 3,000 examples: a RecursionError, seed 2597382088)."""

    def __init__(self, monkeypatch):
        self.handed = self.later = 0
        own = _OWN_AHEAD_PART

        def counted(backend, until):
            got = own(backend, until)
            if got[1]:
                self.handed += 1
                self.later += backend._ahead is not None  # more parts of the run to come
            return got

        monkeypatch.setattr(backend_module.SimBackend, "_ahead_part", counted)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(busy())
def test_runs_past_arrivals_equal_the_scheduler_step_by_step(monkeypatch, case):
    parts = Parts(monkeypatch)
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    event(f"runs handed in parts: {parts.handed > 0}")
    assert fast.steps == slow.steps
    assert fast.finished == slow.finished
    assert fast.pool == slow.pool
    same_summaries(fast, slow)


def test_a_run_past_arrivals_is_handed_over_in_parts_with_the_queue_growing(monkeypatch):
    """One request running at a time (``max_num_seqs`` 1), 40 tokens out each (steps of about
    1.1 ms), arrivals every ~3 ms: the first request's run is taken once and handed over in parts, the queue one longer
    in each part than in the one before, as the scheduler stepping alone reports it."""
    parts = Parts(monkeypatch)
    engine = facts(4, 64, 1, 64, True)
    requests = [SampledRequest(tuple(range(i, i + 5)), 40, "random") for i in range(12)]
    case = (engine, requests, "open", 300.0, None, 0.0)
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps and fast.finished == slow.finished and fast.pool == slow.pool
    assert parts.handed > 5 and parts.later > 0
    waiting = [s["num_waiting"] for s in slow.steps[:40]]
    assert waiting == sorted(waiting) and waiting[-1] - waiting[0] >= 3  # arrivals joined during the run


def test_a_first_block_hashed_in_a_run_settles_deferred_blocks_in_the_steps_order():
    """Found by the fuzz profile: requests of one first block (prompt (0,), salted alike) whose
    first block fills during a decode run, while the run's takes evict deferred blocks of an
    earlier one of them: the first block's hash settles those blocks (engine.deferred_hashes), so
    the run's blocks are settled step by step (engine.run_settle.settle); before, one cached
    entry too many was left."""
    engine = facts(4, 27, 3, 4, True)
    prompts = [(0,), (0,), (3, 13, 0), (3, 13, 0), (0,)]
    requests = [SampledRequest(p, n, "random") for p, n in zip(prompts, [40, 48, 13, 20, 8])]
    case = (engine, requests, "open", 300.0, None, 0.0)
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps and fast.finished == slow.finished
    assert fast.pool == slow.pool
