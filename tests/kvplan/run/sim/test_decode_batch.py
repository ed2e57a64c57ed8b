"""Decode steps kept as a batch across steps (engine.decode_step.DecodeBatch) equal the engine's
scheduler stepping alone, on levels like chat.yaml's: many short requests running, one finishing
and one admitted in nearly every step, the last admitted in its chunked prefill, with and without
prefix caching, tight pools (preemption: the scheduler's steps), closed and open loop. Every step's
stats, every finished request, the block manager's state at the end and the level's summary are
compared (the helpers of test_decode_runs)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import decode_step
from kvplan.results.metrics import step_fields
from kvplan.results.stats.steady import LevelSchedule
from kvplan.traffic.requests import SampledRequest
from tests.kvplan.run.sim.test_decode_runs import facts, run, same_summaries


@st.composite
def chat_levels(draw):
    """Many short requests (a shared prefix some of the time, so prefix caching hits), a budget
    that prompts overrun (chunked prefill), a pool from tight (preemption) to roomy."""
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    shared = draw(st.lists(st.integers(0, 30), max_size=20))
    requests = [
        SampledRequest(
            tuple(shared + draw(st.lists(st.integers(0, 30), min_size=1, max_size=40))),
            draw(st.integers(1, 24)),
            "random",
        )
        for _ in range(draw(st.integers(10, 60)))
    ]
    longest = max(-(-(r.num_tokens - 1) // block_size) for r in requests)
    num_blocks = draw(st.integers(longest, longest * 40))
    max_num_seqs = draw(st.integers(2, 48))
    engine = facts(block_size, num_blocks, max_num_seqs, draw(st.integers(8, 160)), draw(st.booleans()))
    mode = draw(st.sampled_from(["closed", "open"]))
    value = draw(st.integers(2, 48)) if mode == "closed" else draw(st.sampled_from([300.0, 3000.0]))
    plan = draw(st.sampled_from([None, LevelSchedule(num_requests=len(requests), warmup_requests=4)]))
    return engine, requests, mode, value, plan, draw(st.sampled_from([0.0, 7e-4]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_levels())
def test_batched_decode_steps_equal_the_scheduler_step_by_step(case):
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps
    assert fast.finished == slow.finished
    assert fast.pool == slow.pool
    same_summaries(fast, slow)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_levels())
def test_a_probe_backend_leaves_out_the_residents_and_nothing_else(case):
    """``SimBackend(residents=False)`` (a search probe's): every step as with the residents, but
    for the two resident columns, empty in the batch's steps (the scheduler's steps and a decode
    run's, built from its description, keep theirs); the same finished requests, pool and step
    fields of the summary."""
    lean, whole = run(*case, decode_runs=True, residents=False), run(*case, decode_runs=True)
    residents = ("kv_resident_tokens", "kv_resident_request_ids")
    for thin, full in zip(lean.steps, whole.steps, strict=True):
        assert {k: v for k, v in thin.items() if k not in residents} == {
            k: v for k, v in full.items() if k not in residents
        }
        assert all(thin[name] in ((), full[name]) for name in residents)
    assert (lean.finished, lean.pool) == (whole.finished, whole.pool)
    assert step_fields(lean.log) == step_fields(whole.log) == step_fields(whole.objects)


def test_a_chat_level_is_stepped_by_the_batch_with_its_prefill_and_admissions(monkeypatch):
    """40 users of short requests (prompts of 20-59 tokens over a budget of 48, so a prompt is
    chunked behind the decodes) on a roomy pool: the batch takes most steps, among them steps
    with a prefill chunk behind the decodes and steps that admit, and every step equals the
    scheduler's."""
    taken: list = []
    update = decode_step.DecodeBatch.update

    def spy(self, step, token_id, now):
        taken.append((self.tail is not None, len(step.admitted.scheduled)))
        return update(self, step, token_id, now)

    monkeypatch.setattr(decode_step.DecodeBatch, "update", spy)
    engine = facts(16, 4000, 64, 48, False)
    requests = [SampledRequest(tuple(range(i % 40 + 20)), 3 + i % 11, "random") for i in range(400)]
    case = (engine, requests, "closed", 40, None, 0.0)
    fast = run(*case, decode_runs=True)
    monkeypatch.setattr(decode_step.DecodeBatch, "update", update)
    slow = run(*case, decode_runs=False)
    assert fast.steps == slow.steps and fast.finished == slow.finished and fast.pool == slow.pool
    assert len(taken) > 0.8 * len(slow.steps)
    assert sum(tail for tail, _ in taken) > 100  # a prefill chunk behind the decodes
    assert sum(n > 0 for _, n in taken) > 0.8 * len(taken)  # a chunk or an admission in most
    # a search probe's backend (residents=False): the batch's steps leave the residents out
    lean = run(*case, decode_runs=True, residents=False)
    left_out = sum(s["kv_resident_tokens"] == () and s["num_used_blocks"] > 0 for s in lean.steps)
    assert left_out >= len(taken) - 1  # the batch's steps (its last may end the level: none held)
    assert all(s["kv_resident_tokens"] for s in fast.steps if s["num_used_blocks"])
