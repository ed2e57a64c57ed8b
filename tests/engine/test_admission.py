"""Admission at the entry (engine.admission), narrated on the scheduler with hand-counted blocks,
then on the tiny engine: a burst above capacity is refused instead of preempted.

block_size 4. A request of prompt P and max_tokens M holds at most ceil((P + M - 1) / 4) blocks.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.admission import budget_blocks, reason_of
from engine.config import EngineConfig, SettingError
from engine.request import FinishReason, Request, RequestStatus, SamplingParams
from engine.scheduler import Scheduler
from tests.engine.test_scheduler import step


def make(num_blocks=24, **cfg):
    cfg.setdefault("block_size", 4)
    cfg.setdefault("enable_prefix_caching", False)
    return Scheduler(EngineConfig(num_blocks=num_blocks, **cfg), num_blocks, 256)


def add(s, rid, prompt_len=20, max_tokens=20, tenant=None):
    r = Request(rid, tuple(range(3, 3 + prompt_len)), SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0.0)
    r.tenant = tenant
    s.add_request(r, 0.0)
    return r


def run(s):
    """Step to the end; returns (finished requests, preemptions)."""
    done, preempted = [], 0
    while s.has_unfinished() or s.has_untaken_finished():
        preempted += len(step(s).preempted_request_ids)
        done += s.take_finished()
    return done, preempted


def test_the_kv_budget_refuses_what_would_not_fit_and_nothing_is_preempted():
    # 20 + 20 - 1 = 39 tokens -> 10 blocks each; budget floor(24 x 1) = 24 blocks: 2 fit (20), a third would make 30
    s = make(kv_admission_reserve=0.0)
    requests = [add(s, str(i)) for i in range(6)]
    assert [r.finish_reason for r in requests] == [None, None] + [FinishReason.REJECTED] * 4
    assert requests[2].finish_detail == "kv_budget: needs 10 blocks, 20 of 24 reserved"
    assert s.admission.num_reserved_blocks == 20
    done, preempted = run(s)
    assert preempted == 0 and sorted(r.finish_reason for r in done).count(FinishReason.LENGTH) == 2
    assert s.admission.num_reserved_blocks == 0  # every block given back
    # without admission the same burst runs: 24 blocks cannot hold 6 x 10, so it preempts
    s = make()
    for i in range(6):
        add(s, str(i))
    done, preempted = run(s)
    assert preempted > 0 and [r.finish_reason for r in done] == [FinishReason.LENGTH] * 6


def test_the_reserve_shrinks_the_budget_and_a_request_over_it_alone_cannot_fit():
    assert budget_blocks(24, 0.25) == 18 and budget_blocks(45, 0.1) == 40  # floor(45 x 0.9 = 40.5)
    s = make(kv_admission_reserve=0.25)
    first, second = add(s, "a"), add(s, "b")  # 10 blocks, then 10 more: 20 > 18
    assert first.status is RequestStatus.WAITING and reason_of(second.finish_detail) == "kv_budget"
    too_long = add(s, "c", prompt_len=60, max_tokens=20)  # 79 tokens -> 20 blocks > 18 on its own
    assert too_long.finish_reason == FinishReason.CANNOT_FIT
    assert too_long.finish_detail == "needs 20 blocks, the KV admission budget is 18"


def test_a_reserve_that_leaves_no_block_is_refused_at_the_start():
    assert budget_blocks(24, 0.95) == 1  # floor(24 x 0.05 = 1.2): one block, a budget still
    make(kv_admission_reserve=0.95)
    with pytest.raises(SettingError, match=r"^kv_admission_reserve: leaves a KV budget of 0 of the pool's 24 blocks"):
        make(kv_admission_reserve=0.96)  # floor(24 x 0.04 = 0.96) = 0


def test_the_queue_bound_counts_waiting_requests():
    s = make(num_blocks=200, max_num_waiting=3)
    requests = [add(s, str(i), prompt_len=4, max_tokens=2) for i in range(5)]
    assert [r.finish_reason for r in requests] == [None] * 3 + [FinishReason.REJECTED] * 2
    assert requests[3].finish_detail == "queue_full: 3 waiting, max_num_waiting 3"
    step(s)  # all three admitted: the queue is empty again
    assert add(s, "5", prompt_len=4, max_tokens=2).status is RequestStatus.WAITING


def test_max_output_tokens_clamps_max_tokens_and_min_tokens():
    s = make(num_blocks=200, max_output_tokens=8)
    r = Request("r", (5, 6, 7), SamplingParams(max_tokens=50, min_tokens=30, ignore_eos=True), 0.0)
    s.add_request(r, 0.0)
    assert (r.sampling_params.max_tokens, r.sampling_params.min_tokens) == (8, 8)
    done, _ = run(s)
    assert len(done[0].output_token_ids) == 8 and done[0].finish_reason == FinishReason.LENGTH


def test_a_tenant_at_its_concurrency_cap_waits_while_others_go_first():
    s = make(num_blocks=200, tenant_max_concurrency=2, tenant_max_waiting=3)
    a = [add(s, f"a{i}", prompt_len=4, max_tokens=3, tenant="a") for i in range(5)]
    b = add(s, "b0", prompt_len=4, max_tokens=3, tenant="b")
    assert [r.finish_reason for r in a] == [None] * 3 + [FinishReason.REJECTED] * 2  # 3 queued at most
    assert a[3].finish_detail == "tenant_waiting: tenant 'a' has 3 waiting, max 3"
    out = step(s)
    assert [x.request_id for x in out.scheduled] == ["a0", "a1", "b0"]  # a2 passed over, keeps its place
    assert [r.request_id for r in s.waiting] == ["a2"]
    stats = s.step_stats(0, 0.0, 1.0, out, 0)
    assert (stats.tenant_ids, stats.tenant_num_running, stats.tenant_num_waiting) == (("a", "b"), (2, 1), (1, 0))
    assert b.status is RequestStatus.RUNNING


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("xyz"), st.integers(1, 30), st.integers(1, 12)), min_size=1, max_size=40),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(12, 40),
)
def test_per_tenant_limits_and_the_budget_hold_at_every_step(arrivals, cap, queue, num_blocks):
    s = make(num_blocks=num_blocks, kv_admission_reserve=0.0, tenant_max_concurrency=cap, tenant_max_waiting=queue)
    pending = list(enumerate(arrivals))
    while pending or s.has_unfinished():
        for _ in range(2):  # two arrivals a step
            if pending:
                i, (tenant, prompt_len, max_tokens) = pending.pop(0)
                add(s, str(i), prompt_len, max_tokens, tenant)
        out = step(s)
        assert not out.preempted_request_ids
        stats = s.step_stats(0, 0.0, 1.0, out, 0)
        for name, running, waiting in zip(stats.tenant_ids, stats.tenant_num_running, stats.tenant_num_waiting):
            assert running <= cap and waiting <= queue, (name, running, waiting)
            assert running == sum(r.tenant == name for r in s.running)
            assert waiting == sum(r.tenant == name for r in s.waiting)
        assert s.num_used_blocks <= s.admission.num_reserved_blocks <= num_blocks
        s.take_finished()


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("kv_admission_reserve", -0.1, "must be a fraction in [0, 1)"),
        ("kv_admission_reserve", 1.0, "must be a fraction in [0, 1)"),
        ("tenant_max_concurrency", 0, "must be >= 1"),
        ("tenant_max_waiting", 0, "must be >= 1"),
        ("max_num_waiting", 0, "must be >= 1"),
        ("max_output_tokens", -3, "must be >= 1"),
    ],
)
def test_bad_admission_settings_name_their_field(field, value, problem):
    with pytest.raises(SettingError, match=rf"^{field}: {problem.replace('[', '.').replace(')', '.')}"):
        EngineConfig(**{field: value})


def test_the_tiny_engine_sheds_a_burst_instead_of_preempting():
    from collections import Counter

    from tests.engine.tiny import random_prompts, tiny_engine

    def burst(**admission):
        engine = tiny_engine(num_blocks=24, max_num_seqs=8, enable_prefix_caching=False, **admission)
        for prompt in random_prompts([20] * 8):
            engine.add_request(prompt, SamplingParams(max_tokens=20, ignore_eos=True))
        reasons, preempted = Counter(), 0
        while engine.has_unfinished():
            outputs, stats = engine.step()
            reasons.update(o.finish_reason for o in outputs)
            preempted += stats.num_preemptions
        return reasons, preempted

    assert burst(kv_admission_reserve=0.0, max_num_waiting=4) == (Counter(length=2, rejected=6), 0)
    reasons, preempted = burst()
    assert reasons == Counter(length=8) and preempted > 0
