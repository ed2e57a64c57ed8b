"""Metrics on hand-made timestamps, every expected value worked out by hand (times in seconds)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.results import metrics
from kvplan.results.metrics import Slo
from kvplan.results.records import LevelKey, RequestRecord, StepRecord


def req(rid, arrival, token_times, finish=None, reason="length", preemptions=0, prompt=10):
    return RequestRecord(
        request_id=rid,
        bucket="b",
        mode="closed",
        level=4.0,
        arrival_time=arrival,
        first_scheduled_time=arrival,
        finish_time=finish if finish is not None else token_times[-1],
        token_times=tuple(token_times),
        num_prompt_tokens=prompt,
        num_output_tokens=len(token_times),
        max_tokens=max(len(token_times), 1),
        finish_reason=reason,
        num_preemptions=preemptions,
    )


def step(i, used, waiting=0, preemptions=0, total=10, paged=0, measured=0, queried=0, hit=0, level=4.0):
    return StepRecord(
        step_index=i,
        bucket="b",
        mode="closed",
        level=level,
        start_time=i,
        end_time=i + 0.5,
        num_prefill_tokens=0,
        num_decode_tokens=1,
        num_running=1,
        num_waiting=waiting,
        num_used_blocks=used,
        num_free_blocks=total - used,
        num_total_blocks=total,
        num_preemptions=preemptions,
        num_finished=0,
        num_oom=0,
        num_prefix_queried_tokens=queried,
        num_prefix_hit_tokens=hit,
        kv_resident_tokens=(),
        ideal_bytes=0,
        paged_bytes=paged,
        contiguous_bytes=0,
        measured_bytes=measured,
    )


# r1: 4 tokens, first at 0.5 s after arrival 0.0, then every 0.2 s.
R1 = req("r1", 0.0, [0.5, 0.7, 0.9, 1.1])
# r2: a single token 0.2 s after arrival: TTFT 200 ms, no TPOT.
R2 = req("r2", 1.0, [1.2])
# r3: rejected before any token (KV OOM): a failure.
R3 = req("r3", 0.5, [], finish=0.6, reason="cannot_fit")
# r4: 2 tokens, first 1.0 s after arrival 0.2, second 0.3 s later; finishes at 1.5 s.
R4 = req("r4", 0.2, [1.2, 1.5], preemptions=1)
REQUESTS = [R1, R2, R3, R4]


def test_per_request_definitions():
    assert metrics.ttft_s(R1) == pytest.approx(0.5)
    assert metrics.e2e_s(R1) == pytest.approx(1.1)
    assert metrics.tpot_s(R1) == pytest.approx((1.1 - 0.5) / 3)  # 0.2 s
    assert metrics.itl_s(R1) == pytest.approx([0.2, 0.2, 0.2])
    assert metrics.tpot_s(R2) is None  # one token: undefined, never 0
    assert metrics.itl_s(R2) == []
    assert metrics.ttft_s(R3) is None and not metrics.completed(R3)
    assert metrics.tpot_s(R4) == pytest.approx(0.3)


def test_level_summary_by_hand():
    s = metrics.summarize_level(LevelKey("b", "closed", 4.0), REQUESTS, [], Slo())
    assert (s.num_requests, s.num_completed, s.num_failed, s.num_cannot_fit) == (4, 3, 1, 1)
    # TTFT over the completed r1, r2, r4 only: [500, 200, 1000] ms; sorted [200, 500, 1000].
    assert s.ttft_ms.count == 3
    assert s.ttft_ms.mean == pytest.approx(1700 / 3)
    assert s.ttft_ms.p50 == pytest.approx(500)
    assert s.ttft_ms.p90 == pytest.approx(500 + 0.8 * 500)  # rank 0.9 * 2 = 1.8
    assert s.ttft_ms.p95 == pytest.approx(950)
    assert s.ttft_ms.p99 == pytest.approx(990)
    # TPOT over r1 (200 ms) and r4 (300 ms); r2 has none.
    assert (s.tpot_ms.count, s.tpot_ms.mean, s.tpot_ms.p50, s.tpot_ms.p90) == (
        2,
        pytest.approx(250),
        pytest.approx(250),
        pytest.approx(290),
    )
    # ITL pooled: r1's three 200 ms gaps and r4's 300 ms gap.
    assert (s.itl_ms.count, s.itl_ms.mean, s.itl_ms.p50) == (4, pytest.approx(225), pytest.approx(200))
    # E2E [1100, 200, 1300] ms.
    assert s.e2e_ms.p50 == pytest.approx(1100) and s.e2e_ms.mean == pytest.approx(2600 / 3)
    # Span: first arrival 0.0 s to last finish 1.5 s; 7 output tokens, 30 prompt tokens completed.
    assert s.duration_s == pytest.approx(1.5)
    assert s.output_tokens_per_s == pytest.approx(7 / 1.5)
    assert s.total_tokens_per_s == pytest.approx(37 / 1.5)
    assert s.requests_per_s == pytest.approx(2.0)
    assert s.goodput_rps == pytest.approx(2.0)  # no SLO: every completed request counts
    assert s.num_preempted_requests == 1


def test_goodput_with_an_slo_that_half_the_requests_meet():
    # Four completed requests, TTFT 100, 200, 300, 400 ms; all arrive at 0 and finish by 2.0 s.
    reqs = [req(f"q{i}", 0.0, [0.1 * i, 2.0]) for i in (1, 2, 3, 4)]
    s = metrics.summarize_level(LevelKey("b", "closed", 4.0), reqs, [], Slo(ttft_ms=250))
    assert s.slo_attainment == pytest.approx(0.5)
    assert s.goodput_rps == pytest.approx(2 / 2.0)
    assert s.requests_per_s == pytest.approx(4 / 2.0)


def test_tpot_slo_cannot_fail_a_one_token_request():
    slo = Slo(tpot_ms=250)
    assert metrics.meets_slo(R1, slo)  # TPOT 200 ms
    assert metrics.meets_slo(R2, slo)  # no TPOT: nothing to miss
    assert not metrics.meets_slo(R4, slo)  # TPOT 300 ms
    assert not metrics.meets_slo(R3, Slo())  # a failure never counts as good
    assert not metrics.meets_slo(R1, Slo(e2e_ms=1000))  # E2E 1100 ms


def test_kv_and_queue_from_steps():
    steps = [
        step(0, 2, waiting=0, paged=8, measured=8),
        step(1, 6, waiting=3, preemptions=1, paged=24, measured=24),
        step(2, 4, waiting=1, paged=16, measured=20, queried=32, hit=8),
    ]
    s = metrics.summarize_level(LevelKey("b", "closed", 4.0), [], steps, Slo())
    assert (s.num_steps, s.num_preemptions, s.peak_used_blocks, s.num_total_blocks) == (3, 1, 6, 10)
    assert s.mean_used_blocks == pytest.approx(4.0)
    assert s.mean_kv_usage == pytest.approx(0.4) and s.peak_kv_usage == pytest.approx(0.6)
    assert (s.mean_queue_len, s.max_queue_len) == (pytest.approx(4 / 3), 3)
    assert s.max_paged_error_bytes == 4 and s.peak_measured_bytes == 24
    assert s.prefix_hit_rate == pytest.approx(0.25)
    # No requests: rates undefined rather than 0 or a division error.
    assert s.requests_per_s is None and s.ttft_ms is None and s.slo_attainment is None


def level(n, preemptions, mode="closed", requests=(R1,), planned=None):
    return metrics.summarize_level(
        LevelKey("b", mode, float(n)), list(requests), [step(0, 1, preemptions=preemptions)], Slo(), num_planned=planned
    )


def test_knee_is_the_lowest_level_that_preempted():
    levels = [level(1, 0), level(4, 0), level(16, 5), level(8, 2), level(2.0, 9, mode="open")]
    assert metrics.measured_knee(levels) == 8
    assert metrics.max_clean_concurrency(levels) == 4
    assert metrics.measured_knee(levels[:2]) is None
    assert metrics.max_clean_concurrency(levels[:2]) == 4


def test_a_level_where_requests_did_not_all_complete_is_not_clean():
    # c=6: its only request could not fit (no preemption, nothing completed); c=5 was stopped
    # after 1 of 3 planned requests; c=3 completed 1 of 1 planned.
    levels = [level(3, 0, planned=1), level(5, 0, planned=3), level(6, 0, requests=(R3,))]
    assert [(s.num_completed, s.partial) for s in levels] == [(1, False), (1, True), (0, False)]
    assert metrics.max_clean_concurrency(levels) == 3
    assert metrics.max_clean_concurrency(levels[1:]) is None
    saved = levels[1].model_dump(mode="json")  # as results.json keeps it
    assert saved["partial"] is True and saved["num_planned"] == 3


def test_summaries_group_by_level_in_order():
    a, b = req("a", 0.0, [0.1]), req("b", 0.0, [0.2])
    b = RequestRecord(**{**b.__dict__, "level": 8.0})
    out = metrics.summarize_levels([a, b], [step(0, 1), step(1, 2, level=8.0)], Slo())
    assert [(s.level, s.num_requests, s.num_steps) for s in out] == [(4.0, 1, 1), (8.0, 1, 1)]


def test_p95_request_tokens_rounds_up():
    # 1..20: rank 0.95 * 19 = 18.05 -> 19 + 0.05 = 19.05 -> 20 tokens.
    assert metrics.p95_request_tokens(list(range(1, 21))) == 20
    assert metrics.p95_request_tokens([40] * 5) == 40
    assert metrics.latency_stats([]) is None


def test_peak_blocks_count_the_blocks_held_during_a_step():
    """A level of one-token requests: every step ends with 0 blocks in use, because its requests
    finished and freed theirs; the blocks held during the step (9 and 6 of 10) are the peak."""
    from dataclasses import replace

    steps = [replace(step(0, 0), num_peak_used_blocks=9), replace(step(1, 0), num_peak_used_blocks=6)]
    s = metrics.summarize_level(LevelKey("b", "closed", 4.0), [R2], steps, Slo())
    assert (s.peak_used_blocks, s.peak_kv_usage) == (9, 0.9)
    assert s.mean_used_blocks == 0.0  # after each step, as before
    # steps recorded before the field existed (None) give their after-step count
    old = metrics.summarize_level(LevelKey("b", "closed", 4.0), [R2], [step(0, 3), step(1, 5)], Slo())
    assert (old.peak_used_blocks, old.peak_kv_usage) == (5, 0.5)


def test_a_session_levels_achieved_rate_counts_sessions_as_its_requested_rate_does():
    """An open level of 2 sessions/s: sessions start at 0, 0.5, 1.0 s (sent then), each with a second
    turn 0.2 s later. Sessions: (3 - 1) / (1.0 - 0) = 2.0/s; counting turns would give 5 / 1.2 = 4.17/s."""
    records = []
    for s, start in enumerate((0.0, 0.5, 1.0)):
        for turn, at in ((1, start), (2, start + 0.2)):
            r = req(f"b/open/2/{s}/{turn}", at, [at + 0.05, at + 0.1])
            records.append(
                RequestRecord(
                    **{**r.__dict__, "mode": "open", "level": 2.0, "sent_time": at, "session": s, "turn": turn}
                )
            )
    summary = metrics.summarize_level(LevelKey("b", "open", 2.0), records, [], Slo())
    assert summary.requested_rate == 2.0
    assert summary.achieved_rate == pytest.approx(2.0)


ODD_COUNT = st.sampled_from([0, 2**53, 2**64, -(2**63), 3.5])


def _count_lists(n: int):
    clean = st.lists(st.integers(0, 70_000), min_size=n, max_size=n)
    mixed = st.lists(st.one_of(st.integers(0, 70_000), ODD_COUNT), min_size=n, max_size=n)
    return st.tuples(*(st.one_of(clean, clean, clean, mixed) for _ in range(3)))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12).flatmap(_count_lists))
def test_kv_usage_is_each_steps_quotient_as_python_divides(columns):
    """peak and mean KV cache usage from arrays equal those from Python's division step by step
    (ints past 2**53, or a float, take the step-by-step path); by hand: held 3 of 4 blocks is the
    peak 0.75, used 1 of 4 and a step with no blocks average 0.125."""
    from kvplan.results.metrics import _kv_usage

    used, held, totals = columns
    got = _kv_usage(used, held, totals)
    assert got["peak_kv_usage"] == max((h / t for h, t in zip(held, totals) if t), default=0.0)
    mean = float(np.mean([u / t if t else 0.0 for u, t in zip(used, totals)])) if used else 0.0
    assert got["mean_kv_usage"] == mean and type(got["mean_kv_usage"]) is float
    assert _kv_usage([1, 2], [3, 2], [4, 0]) == {"peak_kv_usage": 0.75, "mean_kv_usage": 0.125}
