"""The steered searches (kvplan.run.sim.brackets.steered) give the plain searches' answers wherever
the test is monotone, whatever the guesses, and simulate fewer levels when the guesses are good."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.results.metrics import Slo
from kvplan.results.records import RequestRecord
from kvplan.results.stats.latency import LatencyStats
from kvplan.run.sim import edges
from kvplan.run.sim.brackets import beyond, highest_int, highest_rate, steered


def _counted(limit: float):
    asked: list[float] = []

    def ok(value: float) -> bool:
        asked.append(value)
        return value <= limit

    return ok, asked


def _steer(search, limit: float, guesses: list[float | None]):
    ok, asked = _counted(limit)
    pending = list(guesses)
    answer = steered(search, ok, {}, lambda: pending.pop(0) if pending else None)
    return answer, asked


SEARCHES = {
    "highest_int": lambda top, p: lambda ok: highest_int(ok, top, p),
    "beyond": lambda top, p: lambda ok: beyond(lambda c: c <= top or ok(c), top, 8 * top, p),
}


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(sorted(SEARCHES)),
    top=st.integers(1, 600),
    precision=st.sampled_from([1.0, 1.02, 1.1]),
    limit=st.floats(0, 5000),
    guesses=st.lists(st.one_of(st.none(), st.floats(-10, 6000)), max_size=12),
)
def test_a_steered_concurrency_search_answers_as_the_plain_search(kind, top, precision, limit, guesses):
    search = SEARCHES[kind](top, precision)
    plain = search(lambda c: c <= limit)
    answer, asked = _steer(search, limit, guesses)
    assert answer == plain
    assert len(asked) == len(set(asked))  # no level simulated twice


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(0.01, 500),
    top=st.one_of(st.none(), st.floats(0.01, 1000)),
    limit=st.floats(0.001, 2000),
    guesses=st.lists(st.one_of(st.none(), st.floats(0, 3000)), max_size=12),
)
def test_a_steered_rate_search_answers_as_the_plain_search(start, top, limit, guesses):
    search = lambda ok: highest_rate(ok, start, top=top)  # noqa: E731
    plain = search(lambda r: r <= limit)
    answer, asked = _steer(search, limit, guesses)
    assert answer == plain
    assert len(asked) == len(set(asked))


def test_a_right_guess_simulates_the_answers_two_levels_and_the_top():
    # the plain search of [1, 64] for an edge at 15: 64, 1, 32, 16, 8, 12, 14, 15 (8 levels)
    search = lambda ok: highest_int(ok, 64)  # noqa: E731
    ok, plain_asked = _counted(15)
    assert search(ok) == (15, 16) and plain_asked == [64, 1, 32, 16, 8, 12, 14, 15]
    answer, asked = _steer(search, 15, [None, 15.4, 15.4])
    assert answer == (15, 16) and asked == [64, 16, 15]


def test_wrong_guesses_cost_at_most_their_tries_then_the_plain_search_goes_on():
    search = lambda ok: highest_int(ok, 64)  # noqa: E731
    answer, asked = _steer(search, 15, [None, 40.0, 3.0, 50.0, 2.0, 30.0])
    assert answer == (15, 16)
    # 64 plain; 41 (guessed to fail: holds), 4 (guessed to hold: holds: right), 51 (to fail: holds),
    # 3 held already implied... then three wrong guesses end the steering
    assert len(asked) <= 8 + 3


def test_once_results_contradict_monotonicity_the_plain_search_is_simulated_step_by_step():
    holds = {20: False, 32: True}  # 20 fails though 32 holds; else below 37
    search = lambda ok: highest_int(ok, 64)  # noqa: E731
    plain_asked: list[int] = []

    def plain_ok(c: int) -> bool:
        plain_asked.append(c)
        return holds.get(c, c < 37)

    plain = search(plain_ok)
    asked: list[int] = []

    def ok(c: int) -> bool:
        asked.append(c)
        return holds.get(c, c < 37)

    answer = steered(search, ok, dict(holds), lambda: 10.5)  # a guess that would mislead
    assert answer == plain == (36, 37)
    assert asked == [c for c in plain_asked if c not in holds]


def _record(ttft: float, e2e: float, tokens: int, reason: str = "stop") -> RequestRecord:
    times = tuple(ttft + (e2e - ttft) * i / max(tokens - 1, 1) for i in range(tokens))
    return RequestRecord(
        request_id="b/closed/1/0", bucket="b", mode="closed", level=1, arrival_time=0.0,
        first_scheduled_time=0.0, finish_time=e2e, token_times=times, num_prompt_tokens=8,
        num_output_tokens=tokens, max_tokens=tokens, finish_reason=reason,
    )  # fmt: skip


def test_a_requests_slo_ratio_is_its_largest_latency_over_its_bound():
    slo = Slo(ttft_ms=2000, tpot_ms=200)
    # TTFT 1.5 s of 2 s = 0.75; TPOT (5.5 - 1.5) / 10 = 0.4 s of 0.2 s = 2.0
    assert edges.slo_ratio(_record(1.5, 5.5, 11), slo) == pytest.approx(2.0)
    assert edges.slo_ratio(_record(1.5, 2.5, 11), slo) == pytest.approx(0.75)  # TPOT 0.1 s: 0.5
    assert edges.slo_ratio(_record(1.5, 2.5, 11, "abort"), slo) == math.inf
    assert edges.slo_ratio(_record(0.3, 9.0, 1), Slo(e2e_ms=3000)) == pytest.approx(3.0)


def test_a_probes_score_is_its_ratio_at_the_attainment_quantile():
    ratios = [i / 10 for i in range(20, 0, -1)]  # 0.1 .. 2.0, twenty of them
    assert edges.score(ratios, 0.95) == pytest.approx(1.9)  # the 19th of 20
    assert edges.score(ratios, 0.5) == pytest.approx(1.0)  # the 10th
    assert math.isnan(edges.score([], 0.95))


def test_the_expected_edge_is_the_secant_between_a_level_that_holds_and_one_that_fails():
    slo = Slo(ttft_ms=2000)
    # 40 scores 0.8, 60 scores 1.3: the line crosses 1 at 40 + 0.2 x 20 / 0.5 = 48
    assert edges.expected_edge({40: True, 60: False, 80: False}, {40: 0.8, 60: 1.3}, {}, slo, 64) == 48
    # only a failing top, score 2.5: in proportion, 64 / 2.5
    assert edges.expected_edge({64: False}, {64: 2.5}, {}, slo, 64) == pytest.approx(25.6)
    assert edges.expected_edge({3.0: True}, {3.0: 0.5}, {}, slo) == pytest.approx(6.0)  # a rate that holds
    assert edges.expected_edge({3.0: False}, {3.0: math.inf}, {}, slo) is None  # no score: no guess


def test_past_max_num_seqs_the_edge_is_where_littles_law_puts_the_queue_at_the_bound():
    stats = LatencyStats(count=100, mean=400.0, p50=300.0, p90=450.0, p95=500.0, p99=800.0)
    at = SimpleNamespace(requests_per_s=40.0, ttft_ms=stats, e2e_ms=None)
    # (2,000 - 500) ms of room x 40 requests/s = 60 users more than the 64
    assert edges.expected_edge({64: True}, {64: 0.25}, {64: at}, Slo(ttft_ms=2000), 64) == pytest.approx(124)


def test_the_expected_knee_is_the_pool_over_a_requests_blocks_halfway_through_its_output():
    requests = [SimpleNamespace(prompt_token_ids=[0] * 40, max_tokens=48)] * 3  # 64 tokens: 4 blocks
    assert edges.expected_knee(requests, 45, 16) == pytest.approx(45 / 4)
