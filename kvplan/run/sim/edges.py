"""Where the capacity search expects the SLO's edge, from the levels it has simulated: the guesses
that steer its searches (kvplan.run.sim.brackets.steered). A guess only orders the simulations: a
wrong one costs a level, never an answer.

Each simulated capacity probe gets a score: its requests' SLO ratios (a request's largest of
TTFT / TTFT bound, TPOT / TPOT bound and E2E / E2E bound; infinite for one that did not complete)
at the attainment target's quantile, so that the probe meets the SLO at that attainment about
where its score is 1 or less. Between a level that meets it and one that misses, the edge is where
the line through their scores crosses 1 (the secant). Past the edge a queue builds, and its wait,
so the score, grows in proportion to the users (Little's law): where two levels fail with scores
above 1, the line through the lowest two crosses 1 at the edge. A level that fails far past the
SLO (a score above ``FAR_SCORE``) bends the secant through it down to the level that holds (the
scores are convex there), so where it is more than twice that level, the guess is at least their
geometric mean: a nearer failing level, from which the line through the two failing ones follows.
Where two levels hold (scores rising, below 1) beside a failing one, the line through the two
holding scores crosses 1 on the edge's other side wherever the scores bend one way below it
(convex, as they rise with the load: the guess from the failing side lands below the edge and the
holding line's above; concave: the reverse), so the guess is the midpoint of the two, the holding
line taken no further than the lowest failing level. A guess from the failing side alone creeps
up through levels that hold (regula falsi's one-sided convergence on a convex function), and a
holding level runs to its end, where a failing one stops early.
Past ``max_num_seqs`` users with only levels that meet it, each user more waits ``1 / X`` s longer
(Little's law, X the requests/s of the highest level that meets it), so the edge is where the TTFT
or E2E P95 grows to its bound; else, with levels on one side only, the score is taken as growing in
proportion to the level.

Requests all of one length (prompt and output) run in waves past ``max_num_seqs``: they start and
finish together, so the queue's wait grows in steps of one E2E per ``max_num_seqs`` users, a
staircase that a line through two scores misses (Llama-3.1-70B at 1,024 / 8,192 tokens, 64 slots:
the secant through 64 and 388 users put the edge at 336, the answer is 384). There X is Little's
law's own (``littles_rate``: the level's users over its mean E2E; the measured window's
requests/s runs above it as waves finish in it), and it is kept past a level that misses while
the edge it gives lies below that level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kvplan.results.metrics import LevelSummary, Slo
from kvplan.results.records import RequestRecord
from kvplan.results.stats.latency import completed, e2e_s, tpot_s, ttft_s

QUEUE_MARGIN = 1.5  # the limit is probed first where its predicted P95 x 1.5 is within the SLO
FAR_SCORE = 4.0  # a failing level this far past the SLO is taken as overloaded: its queue sets its score


def slo_ratio(r: RequestRecord, slo: Slo) -> float:
    """The largest of the request's latency / its SLO bound over the bounds ``slo`` sets (TTFT,
    TPOT, E2E, all in ms); infinite for a request that did not complete. At most 1 exactly when
    kvplan.results.stats.latency.meets_slo holds (bounds > 0)."""
    if not completed(r):
        return math.inf
    ttft, tpot = ttft_s(r), tpot_s(r)
    parts = [0.0]
    for bound, value in ((slo.ttft_ms, ttft), (slo.tpot_ms, tpot), (slo.e2e_ms, e2e_s(r))):
        if bound is not None and value is not None:
            parts.append(value * 1e3 / bound if bound > 0 else (math.inf if value > 0 else 0.0))
    return max(parts)


def score(ratios: Sequence[float], attainment: float) -> float:
    """The ratio at the ``attainment`` quantile of the measured requests that finished (a probe
    stopped once it missed its target has finished fewer than planned: its score is still above
    1, since more than ``1 - attainment`` of them missed); NaN without any."""
    if not ratios:
        return math.nan
    ranked = sorted(ratios)
    return ranked[min(max(math.ceil(attainment * len(ranked)) - 1, 0), len(ranked) - 1)]


def expected_edge(
    known: Mapping[float, bool],
    scores: Mapping[float, float],
    summaries: Mapping[float, LevelSummary],
    slo: Slo,
    top: int | None = None,
    waves: bool = False,
) -> float | None:
    """The level where the SLO is expected to stop holding (see the module docstring), from the
    levels ``known`` (level -> meets it) with their ``scores`` and ``summaries``; ``top``: the
    concurrency search's max_num_seqs (None: a rate search); ``waves``: the bucket's requests are
    all of one length (prompt and output), so past ``top`` they run in waves. None: no guess."""
    held = max((v for v, k in known.items() if k), default=None)
    failed = min((v for v, k in known.items() if not k), default=None)
    if held is not None and top is not None and held >= top and held in summaries and (failed is None or waves):
        # past max_num_seqs: the queue's wait by Little's law (in waves: while below every failing level)
        edge = _queue_edge(held, summaries[held], slo, waves)
        if failed is None or (edge is not None and edge < failed):
            return edge
    line = _queue_line(known, scores, held)
    if line is None and held is not None and failed is not None:
        low, high = scores.get(held, math.nan), scores.get(failed, math.nan)
        if not (math.isfinite(low) and math.isfinite(high) and high > low):
            return None
        line = held + (1.0 - low) * (failed - held) / (high - low)
        if high > FAR_SCORE and failed > 2 * held:  # a far overloaded level: a second one, nearer
            line = max(line, math.sqrt(held * failed))
    if line is not None:
        rising = _held_line(known, scores)
        return line if rising is None or failed is None else (line + min(rising, failed)) / 2
    one = held if held is not None else failed  # one side only: the score in proportion to the level
    ratio = math.nan if one is None else scores.get(one, math.nan)
    return one / ratio if one is not None and math.isfinite(ratio) and ratio > 0 else None


def _queue_line(known: Mapping[float, bool], scores: Mapping[float, float], held: float | None) -> float | None:
    """Where the line through the two lowest failing levels' scores (both finite, above 1, rising)
    crosses 1, when that lies above ``held`` (or 0) and below both: past the edge a queue's wait
    grows in proportion to the users (Little's law), and so do the scores; None otherwise."""
    failing = sorted(v for v, k in known.items() if not k)[:2]
    if len(failing) < 2:
        return None
    (f1, f2), (s1, s2) = failing, (scores.get(failing[0], math.nan), scores.get(failing[1], math.nan))
    if not (math.isfinite(s1) and math.isfinite(s2) and 1.0 < s1 < s2):
        return None
    edge = f1 - (s1 - 1.0) * (f2 - f1) / (s2 - s1)
    return edge if (held or 0.0) < edge < f1 else None


def _held_line(known: Mapping[float, bool], scores: Mapping[float, float]) -> float | None:
    """Where the line through the two highest holding levels' scores (both finite, rising, the
    higher below 1) crosses 1; None otherwise."""
    holding = sorted(v for v, k in known.items() if k)[-2:]
    if len(holding) < 2:
        return None
    (h1, h2), (s1, s2) = holding, (scores.get(holding[0], math.nan), scores.get(holding[1], math.nan))
    if not (math.isfinite(s1) and math.isfinite(s2) and s1 < s2 < 1.0):
        return None
    return h2 + (1.0 - s2) * (h2 - h1) / (s2 - s1)


def _queue_edge(held: float, at: LevelSummary, slo: Slo, waves: bool) -> float | None:
    """``held`` users (at least max_num_seqs, meeting the SLO at ``at``) plus those whose wait in
    the queue, ``1 / X`` s each, brings the TTFT or E2E P95 to its bound; X ``at``'s requests/s
    (in ``waves``: ``littles_rate``); None without a rate or a TTFT or E2E bound."""
    rate = littles_rate(held, at) if waves else at.requests_per_s
    if not rate:
        return None
    room = [
        (bound - stats.p95) / 1e3 * rate
        for bound, stats in ((slo.ttft_ms, at.ttft_ms), (slo.e2e_ms, at.e2e_ms))
        if bound is not None and stats is not None
    ]
    return held + min(room) if room else None


def littles_rate(users: float, at: LevelSummary) -> float | None:
    """The requests/s that ``users`` in a closed loop complete by Little's law (users in the
    system = throughput x mean time in it): ``users`` over ``at``'s mean E2E, s; ``at``'s measured
    requests/s where it has no E2E. The measured window's rate can run above it where requests
    finish in waves (equal lengths: max_num_seqs of them start and finish together), so a queue's
    wait, which grows by one mean E2E per max_num_seqs users more, is predicted from this one."""
    e2e = at.e2e_ms
    if e2e is not None and e2e.mean > 0:
        return users / (e2e.mean / 1e3)
    return at.requests_per_s


def in_waves(requests: Sequence) -> bool:
    """Whether ``requests`` (kvplan.traffic.requests.SampledRequest) are all of one length, prompt
    and output: past max_num_seqs they run in waves (see the module docstring)."""
    return len({(r.num_prompt_tokens, r.max_tokens) for r in requests}) == 1


def expected_knee(requests: Sequence, num_blocks: int, block_size: int) -> float:
    """Where preemption is expected to start: the pool's ``num_blocks`` over the blocks a request
    holds halfway through its output, on average over ``requests`` (kvplan.traffic.requests.
    SampledRequest: prompt token ids and max_tokens): in a closed loop the requests in flight are
    spread over their lives. A guess for the knee's bisection only."""
    held = sum(len(r.prompt_token_ids) + r.max_tokens / 2 for r in requests) / max(len(requests), 1)
    return num_blocks / max(held / block_size, 1e-9)


def queue_cannot_bind(at_top: LevelSummary, extra_users: int, slo: Slo) -> bool:
    """Whether ``extra_users`` more users than max_num_seqs, all waiting in the queue, leave the
    SLO's TTFT and E2E bounds ``QUEUE_MARGIN`` times their predicted P95: by Little's law (mean time in
    the system = users / throughput) each waiting user adds ``1 / X`` s to a request's wait, X the
    requests/s that ``at_top`` (max_num_seqs in flight) completes, so P95 at the limit is predicted
    as ``at_top``'s P95 + ``extra_users / X``. It orders the search only (the limit's level is
    simulated, and where it misses the SLO the search doubles as it would have)."""
    rate = at_top.requests_per_s
    if not rate:
        return False
    wait_ms = extra_users / rate * 1e3
    for bound, stats in ((slo.ttft_ms, at_top.ttft_ms), (slo.e2e_ms, at_top.e2e_ms)):
        if bound is not None and (stats is None or QUEUE_MARGIN * (stats.p95 + wait_ms) > bound):
            return False
    return True
