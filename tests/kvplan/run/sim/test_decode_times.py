"""A decode run's step times in one call (kvplan.run.sim.cost.ModelClock.decode_times and the cost
models' ``decode_seconds``) are float for float the step-by-step ones: every cost model the
simulator times GPU targets with (the roofline, dense and MoE, with attention data parallelism;
aiconfigurator-core's measured silicon), the calibrated linear model and the fixed one, over runs
whose context crosses the silicon model's rounding grid many times."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.run.sim.calibration.fit import LinearStepCost
from kvplan.run.sim.cost import FixedStepCost, ModelClock, decode_seconds, decode_work
from kvplan.sizing.gpus import silicon
from kvplan.sizing.gpus.data_parallel import DataParallelStepCost
from kvplan.sizing.gpus.gpu_perf import lookup_gpu_perf, serving_fit
from kvplan.sizing.gpus.step_cost import roofline
from kvplan.sizing.models.model_source import load_model_config
from kvplan.sizing.models.model_spec import ModelSpec


def _spec(name: str) -> ModelSpec:
    config, resolved = load_model_config(name)[:2]
    return ModelSpec.from_hf_config(config, resolved)


def _each_step(cost, n: int, contexts: np.ndarray) -> list[float]:
    return [cost.step_seconds(decode_work(n, c)) for c in contexts.tolist()]


def _contexts(n: int, first: int, k: int) -> np.ndarray:
    return first + n * np.arange(k, dtype=np.int64)


ROOFLINES = {
    "llama-3.1-70b tp 8": lambda: roofline(_spec("llama-3.1-70b"), lookup_gpu_perf("B200"), serving_fit(), tp=8),
    "deepseek-v3 tp 8": lambda: roofline(_spec("deepseek-v3"), lookup_gpu_perf("B200"), serving_fit(), tp=8),
    "deepseek-v3 tp 2 x dp 4": lambda: DataParallelStepCost(
        roofline(_spec("deepseek-v3"), lookup_gpu_perf("H100-SXM"), serving_fit(), tp=2, dp=4), 4
    ),
    "linear": lambda: LinearStepCost(
        1e-3, {"num_decode_tokens": 3e-5, "num_context_tokens": 1e-7, "num_attended_tokens": 1e-9}, 2e-4
    ),
    "fixed": lambda: FixedStepCost(0.004),
    "without decode_seconds": lambda: _OwnCost(),
}


class _OwnCost:
    """A cost model with ``step_seconds`` only: its decode steps are asked one by one."""

    gap_s = 3e-4

    def step_seconds(self, work) -> float:
        return 0.01 + 1e-6 * work.num_context_tokens / (1 + work.num_decode_tokens % 7)


@pytest.mark.parametrize("name", list(ROOFLINES))
@pytest.mark.parametrize("n, first, k", [(1, 1, 300), (64, 64 * 1025, 2000), (7, 7 * 9000, 500), (300, 300 * 50, 64)])
def test_decode_seconds_equal_each_steps_seconds(name, n, first, k):
    cost = ROOFLINES[name]()
    contexts = _contexts(n, first, k)
    assert decode_seconds(cost, n, contexts).tolist() == _each_step(cost, n, contexts)


@pytest.fixture(scope="module")
def silicon_costs():
    pytest.importorskip("aiconfigurator_core")
    costs = {
        "llama-3.1-8b h100 tp 2": silicon.silicon_cost(load_model_config("llama-3.1-8b")[0], "h100_sxm", 2),
        "llama-3.1-70b b200 tp 8": silicon.silicon_cost(load_model_config("llama-3.1-70b")[0], "b200_sxm", 8),
    }
    for name, cost in costs.items():
        assert isinstance(cost, silicon.SiliconStepCost), (name, cost)
    return costs


@pytest.mark.parametrize("which", ["llama-3.1-8b h100 tp 2", "llama-3.1-70b b200 tp 8"])
@pytest.mark.parametrize("n, first, k", [(1, 1, 3000), (64, 64 * 1025, 8192), (5, 5 * 120, 400)])
def test_silicon_decode_seconds_equal_each_steps_seconds(silicon_costs, which, n, first, k):
    """Over up to 8,192 steps: the context per decode climbs from below the exact range (128)
    through hundreds of rounded shapes."""
    cost = silicon_costs[which]
    contexts = _contexts(n, first, k)
    assert decode_seconds(cost, n, contexts).tolist() == _each_step(cost, n, contexts)
    dp = DataParallelStepCost(cost, 2)
    assert decode_seconds(dp, n, contexts).tolist() == _each_step(dp, n, contexts)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 2**40), min_size=1, max_size=50))
def test_shapes_round_alike_one_by_one_and_as_an_array(values):
    assert silicon._q_array(np.array(values, dtype=np.int64)).tolist() == [silicon._q(x) for x in values]


def test_the_rounding_grid_near_powers_of_two():
    values = [x for p in range(7, 50) for x in (2**p - 1, 2**p, 2**p + 1, 2**p + 2 ** (p - 7), 3 * 2 ** (p - 1))]
    values += list(range(1, 5000))
    assert silicon._q_array(np.array(values, dtype=np.int64)).tolist() == [silicon._q(x) for x in values]


@pytest.mark.parametrize(
    "name", ["llama-3.1-70b tp 8", "deepseek-v3 tp 2 x dp 4", "linear", "fixed", "without decode_seconds"]
)
@pytest.mark.parametrize("now", [0.0, 1234.5678901])
def test_a_clock_times_a_run_as_it_times_its_steps_one_by_one(name, now):
    cost = ROOFLINES[name]()
    clock = ModelClock(cost)
    n, context0, k = 48, 48 * 2000 + 17, 1500
    checks, starts, ends = clock.decode_times(now, n, context0, k)
    expected_checks, expected_starts, expected_ends = [], [], []
    t = now
    for j in range(k):
        check, start = clock.next_start(t)
        t = clock.step_end(start, decode_work(n, context0 + n * j))
        expected_checks.append(check)
        expected_starts.append(start)
        expected_ends.append(t)
    assert (checks, starts, ends) == (expected_checks, expected_starts, expected_ends)
    assert clock.decode_times(now, n, context0, 0) == ([], [], [])
