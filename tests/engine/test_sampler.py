"""Sampler: greedy argmax, temperature and top-p distributions, per-request seeds."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from engine.request import SamplingParams
from engine.sampler import Sampler

GREEDY = SamplingParams()


def test_greedy_is_argmax_with_first_index_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 2.0, 5.0]])
    assert Sampler().sample(logits, ["a", "b"], [GREEDY, GREEDY]) == [1, 0]


def draw_counts(params: SamplingParams, logits: list[float], n: int) -> Counter:
    sampler = Sampler()
    sampler.add("r", params)
    row = torch.tensor([logits])
    return Counter(sampler.sample(row, ["r"], [params])[0] for _ in range(n))


def test_temperature_follows_softmax_of_scaled_logits():
    # logits ln([1, 2, 3, 4]) at T = 0.5 -> probabilities proportional to [1, 4, 9, 16] / 30.
    logits = [math.log(x) for x in (1, 2, 3, 4)]
    n = 6000
    counts = draw_counts(SamplingParams(temperature=0.5, seed=7), logits, n)
    for token, p in enumerate([1 / 30, 4 / 30, 9 / 30, 16 / 30]):
        # within 4.5 binomial standard deviations
        assert abs(counts[token] / n - p) < 4.5 * math.sqrt(p * (1 - p) / n), (token, counts)


def test_top_p_keeps_the_smallest_set_reaching_p():
    # probabilities [0.5, 0.3, 0.15, 0.05]: top_p 0.7 keeps {0, 1} (0.5 < 0.7 <= 0.8),
    # renormalised to [0.625, 0.375].
    logits = [math.log(x) for x in (0.5, 0.3, 0.15, 0.05)]
    n = 4000
    counts = draw_counts(SamplingParams(temperature=1.0, top_p=0.7, seed=3), logits, n)
    assert set(counts) == {0, 1}
    assert abs(counts[0] / n - 0.625) < 4.5 * math.sqrt(0.625 * 0.375 / n)
    # top_p 0.5 keeps only token 0: the mass before token 1 (0.5) already reaches it.
    assert set(draw_counts(SamplingParams(temperature=1.0, top_p=0.5, seed=3), logits, 200)) == {0}


def test_a_seeded_request_draws_the_same_whatever_its_batch_mates():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    params = SamplingParams(temperature=1.0, seed=42)

    alone = Sampler()
    alone.add("x", params)
    solo = [alone.sample(logits[1:2], ["x"], [params])[0] for _ in range(20)]

    crowded = Sampler(seed=99)
    other = SamplingParams(temperature=0.8)
    crowded.add("a", other)
    crowded.add("x", params)
    crowded.add("b", GREEDY)
    draws = [crowded.sample(logits, ["a", "x", "b"], [other, params, GREEDY])[1] for _ in range(20)]
    assert draws == solo and len(set(solo)) > 1


def test_unseeded_requests_are_reproducible_from_the_engine_seed():
    logits = torch.zeros(1, 1000)  # uniform: any draw sequence is possible
    params = SamplingParams(temperature=1.0)

    def run(seed: int) -> list[int]:
        sampler = Sampler(seed)
        sampler.add("r", params)
        return [sampler.sample(logits, ["r"], [params])[0] for _ in range(10)]

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_freed_request_needs_adding_again():
    sampler = Sampler()
    params = SamplingParams(temperature=1.0, seed=1)
    sampler.add("r", params)
    sampler.free("r")
    with pytest.raises(KeyError):
        sampler.sample(torch.zeros(1, 4), ["r"], [params])
