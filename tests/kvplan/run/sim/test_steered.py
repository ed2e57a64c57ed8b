"""The steered searches (kvplan.run.sim.brackets.steered) give the plain searches' answers wherever
the test is monotone, whatever the guesses, and simulate fewer levels when the guesses are good."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.optimize.plan import RATE_MODE_CONCURRENCY_PRECISION
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


def _guided(score, top: int, precision: float, slo: Slo) -> tuple[tuple, list]:
    """``highest_int(ok, top, precision)`` steered by ``edges.expected_edge`` on the levels' scores
    (``score(users)``; a level holds where it is at most 1): (the answer, the levels asked)."""
    known: dict[float, bool] = {}
    scores: dict[float, float] = {}
    asked: list[float] = []

    def ok(u: float) -> bool:
        asked.append(u)
        scores[u] = score(u)
        return scores[u] <= 1.0

    search = lambda test: highest_int(test, top, precision)  # noqa: E731
    return steered(search, ok, known, lambda: edges.expected_edge(known, scores, {}, slo, top)), asked


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


def test_two_failing_levels_put_the_edge_where_the_line_through_their_scores_crosses_1():
    slo = Slo(ttft_ms=2000)
    # 100 scores 5, 200 scores 15: 0.1 a user, so 1 at 100 - 4 / 0.1 = 60, above the 10 that holds
    failing = {100: False, 200: False}
    assert edges.expected_edge({10: True, **failing}, {10: 0.3, 100: 5.0, 200: 15.0}, {}, slo, 256) == 60
    assert edges.expected_edge(failing, {100: 5.0, 200: 15.0}, {}, slo, 256) == 60  # no level holds yet
    # the line's 60 below a level that holds (70): the secant through 70 and 100 instead
    assert edges.expected_edge({70: True, **failing}, {70: 0.7, 100: 5.0, 200: 15.0}, {}, slo, 256) == pytest.approx(
        70 + 0.3 * 30 / 4.3
    )


def test_a_far_overloaded_level_puts_the_guess_at_least_at_the_geometric_mean():
    slo = Slo(ttft_ms=2000)
    # 10 scores 0.25, 1,000 scores 96 (above FAR_SCORE, over twice 10): the secant's 17.8 is low
    assert edges.FAR_SCORE == 4.0
    assert edges.expected_edge({10: True, 1000: False}, {10: 0.25, 1000: 96.0}, {}, slo, 1024) == pytest.approx(100)
    # not over twice the level that holds, or not that far: the secant
    secant = 40 + 0.2 * 20 / 4.2
    assert edges.expected_edge({40: True, 60: False}, {40: 0.8, 60: 5.0}, {}, slo, 64) == pytest.approx(secant)
    assert edges.expected_edge({10: True, 1000: False}, {10: 0.25, 1000: 3.0}, {}, slo, 1024) == pytest.approx(
        10 + 0.75 * 990 / 2.75
    )


def test_on_scores_that_bend_up_past_the_edge_the_guesses_find_it_in_fewer_levels(monkeypatch):
    """A 4-decode-worker unit's shape (kvplan plan --disagg, 8,000 / 1,000 tokens): the scores stay
    near 0.3 up to about 56 users, then a queue builds and they grow by 0.1 a user. The steered
    search from 1,024 answers as the plain bisection, from 5 levels; with the secant alone, 12."""
    slo = Slo(ttft_ms=2000)
    score = lambda u: 0.25 + 0.009 * u if u <= 57 else 1.0 + 0.1 * (u - 57)  # noqa: E731

    levels = lambda: _guided(score, 1024, 1.1, slo)  # noqa: E731

    answer, asked = levels()
    assert answer == highest_int(lambda u: score(u) <= 1.0, 1024, 1.1) == (56, 60)
    monkeypatch.setattr(edges, "FAR_SCORE", math.inf)
    monkeypatch.setattr(edges, "_queue_line", lambda *args: None)
    monkeypatch.setattr(edges, "_held_line", lambda *args: None)
    secant_answer, secant_asked = levels()
    assert secant_answer == answer and len(asked) == 5 and len(secant_asked) == 12


def test_two_holding_levels_bracket_the_edge_with_the_guess_from_above():
    """A 2P + 2D unit's levels (kvplan plan --disagg, 8,000 / 1,000 tokens, H100-SXM tp 2): its scores
    rise slowly, then jump where a queue builds (240 users hold, 256 fail). The line through the two
    highest holding levels crosses 1 past the edge, the guess from the failing side before it: the
    guess is their midpoint."""
    slo = Slo(ttft_ms=2000, tpot_ms=30)
    scores = {52: 0.3, 176: 0.67, 304: 4.15, 512: 10.18}
    held_line = 176 + 0.33 * (176 - 52) / (0.67 - 0.3)  # 286.59
    # one level failing far (10.18 > FAR_SCORE, 512 > 2 x 176): the geometric mean, 300.18, beats the secant
    known = {52: True, 176: True, 512: False}
    assert edges.expected_edge(known, scores, {}, slo, 512) == pytest.approx((math.sqrt(176 * 512) + held_line) / 2)
    # two failing: the line through them, 304 - 3.15 x 208 / 6.03 = 195.34; the midpoint, 240.97
    known[304] = False
    queue_line = 304 - 3.15 * 208 / 6.03
    assert edges.expected_edge(known, scores, {}, slo, 512) == pytest.approx((queue_line + held_line) / 2)
    # holding scores that barely rise: their line crosses 1 at 1,788, past the lowest failing level (304),
    # which bounds it
    slow = {52: 0.3, 176: 0.35, 304: 4.15, 512: 10.18}
    assert edges.expected_edge(known, slow, {}, slo, 512) == pytest.approx((queue_line + 304) / 2)
    # holding scores that fall, or one holding level: no holding line, the guess from the failing side
    flat = {52: 0.7, 176: 0.67, 304: 4.15, 512: 10.18}
    assert edges.expected_edge(known, flat, {}, slo, 512) == pytest.approx(queue_line)
    level = {52: 0.67, 176: 0.67, 304: 4.15, 512: 10.18}  # equal: a line that never crosses 1
    assert edges.expected_edge(known, level, {}, slo, 512) == pytest.approx(queue_line)
    assert edges.expected_edge({176: True, 304: False, 512: False}, scores, {}, slo, 512) == pytest.approx(queue_line)


def test_on_a_units_measured_scores_the_holding_line_saves_two_levels_that_hold():
    """The 2P + 2D unit's concurrency search (kvplan plan --disagg at 10 req/s, H100-SXM tp 2 over
    rdma-400g, 8,000 / 1,000 tokens, 20 requests): each level's score as kvplan simulated it
    (2026-12-07), the search's precision as plan's at a rate. With the failing side's guesses
    alone the search simulates 208 and 224, both holding (a holding level runs to its end: 1.8 CPU-s
    each there, a failing one about 0.7); with the holding line, neither. The same answer as the
    plain bisection's on these scores."""
    measured = {52: 0.3, 176: 0.67, 208: 0.76, 224: 0.82, 240: 0.99, 256: 1.07, 304: 4.15, 512: 10.18}
    slo, precision = Slo(ttft_ms=2000, tpot_ms=30), RATE_MODE_CONCURRENCY_PRECISION

    levels = lambda: _guided(measured.__getitem__, 512, precision, slo)  # noqa: E731  # unsimulated: KeyError

    answer, asked = levels()
    levels_scores = sorted(measured.items())
    interpolated = lambda u: float(np.interp(u, *zip(*levels_scores)))  # noqa: E731  # rising: monotone
    assert answer == highest_int(lambda u: interpolated(u) <= 1.0, 512, precision) == (240, 256)
    assert asked == [512, 52, 176, 304, 256, 240]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(edges, "_held_line", lambda *args: None)
        failing_side, failing_side_asked = levels()
    assert failing_side == answer and failing_side_asked == [512, 52, 176, 304, 208, 256, 224, 240]


def test_past_max_num_seqs_the_edge_is_where_littles_law_puts_the_queue_at_the_bound():
    stats = LatencyStats(count=100, mean=400.0, p50=300.0, p90=450.0, p95=500.0, p99=800.0)
    at = SimpleNamespace(requests_per_s=40.0, ttft_ms=stats, e2e_ms=None)
    # (2,000 - 500) ms of room x 40 requests/s = 60 users more than the 64
    assert edges.expected_edge({64: True}, {64: 0.25}, {64: at}, Slo(ttft_ms=2000), 64) == pytest.approx(124)


def test_in_waves_past_max_num_seqs_the_edge_is_littles_law_at_the_mean_e2e_also_past_a_failing_level():
    # Llama-3.1-70B on B200 x8 at 1,024 / 8,192 tokens, 64 slots: the 64-user level's figures
    ttft = LatencyStats(count=256, mean=125.0, p50=125.0, p90=133.0, p95=134.0, p99=135.0)
    e2e = LatencyStats(count=256, mean=119_658.0, p50=119_650.0, p90=119_660.0, p95=119_670.0, p99=119_700.0)
    at = SimpleNamespace(requests_per_s=0.6615, ttft_ms=ttft, e2e_ms=e2e)
    slo, summaries = Slo(ttft_ms=600_000, tpot_ms=10_000), {64: at}
    # waves: 64 users / 119.658 s = 0.53486 requests/s; (600 - 0.134) s of room x that = 320.84 users
    assert edges.expected_edge({64: True}, {64: 0.0015}, summaries, slo, 64, waves=True) == pytest.approx(384.843)
    # of one length or not, with no failing level; not in waves: the window's 0.6615 requests/s
    assert edges.expected_edge({64: True}, {64: 0.0015}, summaries, slo, 64) == pytest.approx(460.811)
    # past a failing 388 (score 1.1932): in waves still 384.84, below it; else the secant, 335.47
    known, scores = {64: True, 388: False}, {64: 0.0015, 388: 1.1932}
    assert edges.expected_edge(known, scores, summaries, slo, 64, waves=True) == pytest.approx(384.843)
    assert edges.expected_edge(known, scores, summaries, slo, 64) == pytest.approx(335.473)
    # a failing level at or below Little's edge: the secant, waves or not (64 + 0.9985 x 316 / 1.1917)
    known, scores = {64: True, 380: False}, {64: 0.0015, 380: 1.1932}
    assert edges.expected_edge(known, scores, summaries, slo, 64, waves=True) == pytest.approx(328.7697)


def test_requests_run_in_waves_only_when_all_are_of_one_prompt_and_output_length():
    one = SimpleNamespace(num_prompt_tokens=1024, max_tokens=8192)
    assert edges.in_waves([one, one, SimpleNamespace(num_prompt_tokens=1024, max_tokens=8192)])
    assert not edges.in_waves([one, SimpleNamespace(num_prompt_tokens=1024, max_tokens=8191)])
    assert not edges.in_waves([one, SimpleNamespace(num_prompt_tokens=1023, max_tokens=8192)])


def test_a_right_wave_guess_simulates_the_answers_two_levels_past_max_num_seqs():
    # the plain search past 64 for an edge at 386 (384 holds, 388 fails): 128, 256, 512, 384, 448,
    # 416, 400, 392, 388 (9 levels); steered by the waves' edge 384.84: the failing end 388, then 384
    search = lambda ok: beyond(ok, 64, 512, 1.02)  # noqa: E731
    ok, plain_asked = _counted(386)
    assert search(ok) == (384, 388) and plain_asked == [128, 256, 512, 384, 448, 416, 400, 392, 388]
    answer, asked = _steer(search, 386, [384.843, 384.843])
    assert answer == (384, 388) and asked == [388, 384]


def test_the_expected_knee_is_the_pool_over_a_requests_blocks_halfway_through_its_output():
    requests = [SimpleNamespace(prompt_token_ids=[0] * 40, max_tokens=48)] * 3  # 64 tokens: 4 blocks
    assert edges.expected_knee(requests, 45, 16) == pytest.approx(45 / 4)
