"""A simulated request's sampling parameters (kvplan.run.sim.backend.SimBackend._params): checked
once per output length, yet equal, field for field and type for type, to the engine's own
SamplingParams built for each request, and refused exactly where SamplingParams refuses."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import SEED_LIMIT
from engine.request import SamplingParams
from kvplan.run.driver import Submission
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.cost import FixedStepCost, ModelClock
from tests.kvplan.run.sim.test_decode_runs import facts

SEEDS = st.one_of(
    st.integers(0, 10**6),
    st.sampled_from([0, SEED_LIMIT - 1, SEED_LIMIT, -1, True, False, None, np.int64(5), 2.0]),
)
LENGTHS = st.one_of(st.integers(1, 6), st.sampled_from([0, -3, np.int64(3), True, 2.5]))
FORCED = st.one_of(st.none(), st.tuples(st.integers(0, 9), st.integers(0, 9)), st.just((1, "x")))


def _built(max_tokens, seed, forced) -> SamplingParams | str:
    try:
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=seed, forced_token_ids=forced)
    except ValueError as err:
        return str(err)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(LENGTHS, SEEDS, FORCED), min_size=1, max_size=40))
def test_params_equal_the_engines_own_for_every_request(asked):
    backend = SimBackend(facts(4, 64, 4, 64, False), ModelClock(FixedStepCost(0.01)))
    for i, (max_tokens, seed, forced) in enumerate(asked):
        expected = _built(max_tokens, seed, forced)
        submission = Submission(f"b/closed/1/{i}", (1, 2, 3), max_tokens, seed, "s", 0.0, forced)
        if isinstance(expected, str):  # refused: the same error as the engine's own
            with pytest.raises(ValueError) as err:
                backend.submit(submission)
            assert str(err.value) == expected
            continue
        backend.submit(submission)
        got = backend.scheduler.waiting[-1].sampling_params
        assert got == expected
        assert {k: type(v) for k, v in vars(got).items()} == {k: type(v) for k, v in vars(expected).items()}


@pytest.mark.parametrize("seed", [SEED_LIMIT, -1, True, np.int64(-2), 2.5])
def test_a_bad_seed_is_refused_after_its_length_was_checked(seed):
    """The length's params are kept from the first request; a later bad seed is still refused as
    SamplingParams refuses it (a bool or numpy seed goes through its checks every time)."""
    backend = SimBackend(facts(4, 64, 4, 64, False), ModelClock(FixedStepCost(0.01)))
    backend.submit(Submission("b/closed/1/0", (1, 2, 3), 2, 7, "s", 0.0))
    expected = _built(2, seed, None)
    if isinstance(expected, str):
        with pytest.raises(ValueError, match="seed"):
            backend.submit(Submission("b/closed/1/1", (1, 2, 3), 2, seed, "s", 0.0))
    else:  # a numpy or bool seed SamplingParams takes: kept as it was given
        backend.submit(Submission("b/closed/1/1", (1, 2, 3), 2, seed, "s", 0.0))
        assert backend.scheduler.waiting[-1].sampling_params == expected
