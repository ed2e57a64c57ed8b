"""Steps read back from client-side token times (kvplan.run.sim.calibration.client_steps), checked
against the engine's scheduler itself: a simulated run on a known linear step cost records both
its steps and its requests' token times; the steps read back from the token times alone must be
those steps, work and seconds, and the fit on them must give back the known cost."""

import numpy as np
import pytest

from kvplan.results.run_result import load_run
from kvplan.results.simulated import CostModelInfo
from kvplan.run.sim.calibration.client_steps import client_samples, client_steps
from kvplan.run.sim.calibration.fit import FEATURES, LinearStepCost, fit_samples
from kvplan.run.sim.cost import ModelClock, StepJitter, StepWork
from kvplan.run.sim.facts import simulated_facts
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import SimSetup
from kvplan.workload.schema import Workload

KNOWN = LinearStepCost(
    2e-3,
    {
        "num_prefill_tokens": 4e-5,
        "num_decode_tokens": 3e-4,
        "num_prefill_seqs": 5e-4,
        "num_context_tokens": 2e-6,
        "num_attended_tokens": 1e-8,
    },
    0.0,
)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    return _simulate(tmp_path_factory.mktemp("sim") / "run", 0.0)


def _simulate(run_dir, lag: float, jitter=None):
    workload = Workload.model_validate(
        {
            "name": "client-steps",
            "seed": 3,
            "engine": {
                "model": "tiny-random-llama",
                "dtype": "float32",
                "block_size": 4,
                "num_blocks": 4096,  # no preemption: every recompute would look like a decode
                "max_num_seqs": 16,
                "max_num_batched_tokens": 512,  # every prompt prefilled whole
            },
            "dataset": "random",
            "buckets": [
                {
                    "name": "b",
                    "input_tokens": [8, 120],
                    "output_tokens": [4, 40],
                    "concurrency": [1, 3, 8],
                    "num_requests": 24,
                },
            ],
        }
    )
    setup = SimSetup(
        simulated_facts(workload, "cpu", "torch"),
        lambda: ModelClock(KNOWN, lag, jitter=jitter),
        CostModelInfo(kind="calibrated", description="known"),
    )
    return load_run(simulate(workload, setup, run_dir, search=False))


def test_the_steps_read_from_token_times_are_the_engine_s_steps(simulated):
    steps = [s for s in simulated.steps if s.num_prefill_tokens + s.num_decode_tokens > 0]
    since = {}  # (level, step end) -> (the step, the end of the level's step before it)
    last = {}
    for s in steps:
        since[(s.key.name, s.end_time)] = (s, last.get(s.key.name))
        last[s.key.name] = s.end_time
    read = client_steps(simulated.requests)
    # left out: each level's first step, and steps that may have waited for a request to be sent
    assert 0.9 * len(steps) <= len(read) < len(steps)
    for end, sample in read:
        step, before = since[(sample.level, end)]
        assert sample.work == StepWork.of(step), (end, sample)
        assert sample.seconds == pytest.approx(end - before, abs=1e-12)
        assert sample.seconds == pytest.approx(KNOWN.step_seconds(sample.work), rel=1e-9)


@pytest.mark.parametrize("mean", [False, True])
def test_the_fit_on_them_gives_back_the_known_cost(simulated, mean):
    fit = fit_samples(client_samples(simulated.requests), mean=mean)
    assert fit.model.intercept_s == pytest.approx(KNOWN.intercept_s, rel=1e-6)
    for name in FEATURES:
        assert fit.model.coefficients.get(name, 0.0) == pytest.approx(KNOWN.coefficients[name], rel=1e-6), name
    assert fit.r2 == pytest.approx(1.0) and fit.num_outliers == 0


def test_the_mean_fit_keeps_the_measured_total_time():
    """Ordinary least squares with an intercept: the residuals sum to zero, so the fitted steps add
    up to the measured ones whatever their noise (a relative fit with outliers dropped does not)."""
    import numpy as np

    from kvplan.run.sim.calibration.fit import StepSample

    rng = np.random.default_rng(1)
    samples = []
    for i in range(400):
        n = int(rng.integers(1, 12))
        work = StepWork(0, n, 0, 40 * n, 40 * n, 40 * n)
        slow = 0.03 if i % 17 == 0 else 0.0  # the server's own hiccups
        samples.append(StepSample("b", work, 0.02 + 0.003 * n + rng.exponential(0.004) + slow, None))
    total = sum(s.seconds for s in samples)
    mean_fit = fit_samples(samples, mean=True).model
    assert sum(mean_fit.step_seconds(s.work) for s in samples) == pytest.approx(total, rel=1e-9)
    relative_fit = fit_samples(samples).model
    assert sum(relative_fit.step_seconds(s.work) for s in samples) < 0.97 * total


def test_a_client_s_jitter_leaves_the_steps_and_moves_the_fit_little(simulated):
    """Every token delayed by up to 0.4 ms (a client's event-loop lag; the steps here last 2.5 ms
    and more): the same steps are found, and the fitted model times them within 5 %."""
    import dataclasses

    import numpy as np

    rng = np.random.default_rng(0)
    jittered = [
        dataclasses.replace(r, token_times=tuple(t + d for t, d in zip(r.token_times, rng.uniform(0, 4e-4, 1000))))
        for r in simulated.requests
    ]
    exact, late = client_samples(simulated.requests), client_samples(jittered)
    assert [s.work for s in late] == [s.work for s in exact]
    model = fit_samples(late).model
    errors = [model.step_seconds(s.work) / KNOWN.step_seconds(s.work) - 1 for s in exact]
    assert float(np.median(np.abs(errors))) < 0.05


LAG = 4e-3  # a server's front end, s


@pytest.fixture(scope="module")
def lagged(tmp_path_factory):
    """The same requests simulated with each reaching the scheduler ``LAG`` after it is sent."""
    return _simulate(tmp_path_factory.mktemp("lagged") / "run", LAG)


def test_the_front_end_is_read_back_from_the_requests_that_found_the_server_idle(simulated, lagged):
    from kvplan.run.sim.calibration.client_steps import front_end_seconds

    assert front_end_seconds(lagged.requests, KNOWN) == pytest.approx(LAG, abs=1e-9)
    assert front_end_seconds(simulated.requests, KNOWN) == pytest.approx(0.0, abs=1e-9)
    # every TTFT of c=1 (always alone) is the front end plus its prefill step, by hand
    for r in lagged.requests:
        if r.level == 1:
            n = r.num_prompt_tokens
            prefill = StepWork(n, 0, 1, n, n * (n + 1) // 2, 0)
            assert r.token_times[0] - r.arrival_time == pytest.approx(LAG + KNOWN.step_seconds(prefill), rel=1e-9)


def test_with_a_front_end_the_steps_read_back_are_still_the_engine_s(lagged):
    fit = fit_samples(client_samples(lagged.requests, LAG), mean=True)
    assert fit.model.intercept_s == pytest.approx(KNOWN.intercept_s, rel=1e-6)
    for name in FEATURES:
        assert fit.model.coefficients.get(name, 0.0) == pytest.approx(KNOWN.coefficients[name], rel=1e-6), name


# a server's steps on a CPU: most 0.5 ms short of the mean, a tenth up to 4 ms long
JITTER = StepJitter(tuple([-5e-4] * 90 + [i * 4e-4 for i in range(11)]))


@pytest.fixture(scope="module")
def jittered(tmp_path_factory):
    """The lagged requests again, each step lasting ``KNOWN``'s seconds plus a ``JITTER`` draw."""
    return _simulate(tmp_path_factory.mktemp("jittered") / "run", LAG, JITTER)


def test_the_jitter_read_back_is_that_of_the_simulated_steps(jittered):
    """Each step read back from the token times lasted KNOWN's seconds plus the residual the
    clock drew for it: the percentiles ``step_jitter`` gives are those of the drawn residuals of
    the same steps, matched by their end times in the simulation's own step records."""
    from kvplan.run.sim.calibration.client_steps import step_jitter

    drawn = {s.end_time: s.end_time - s.start_time - KNOWN.step_seconds(StepWork.of(s)) for s in jittered.steps}
    read = client_steps(jittered.requests, LAG)
    assert len(read) > 100
    residuals = [drawn[min(drawn, key=lambda t: abs(t - end))] for end, _ in read]
    quantiles = step_jitter([sample for _, sample in read], KNOWN)
    assert quantiles == pytest.approx(tuple(np.percentile(residuals, np.arange(101))), abs=1e-9)
    assert quantiles[50] == pytest.approx(-5e-4, abs=1e-9) and quantiles[100] <= 4e-3 + 1e-9


def test_the_front_end_is_read_back_under_jitter_once_the_typical_residual_is_taken_off(jittered):
    """A request alone on the server waits LAG, then a prefill step of KNOWN's seconds plus a
    residual whose median is JITTER's (-0.5 ms): TTFT - the model's prefill step has median
    LAG - 0.5 ms, and taking the jitter's median off gives LAG back (to the draws' spread at the
    median, which is 0 here: most residuals are exactly -0.5 ms)."""
    from kvplan.run.sim.calibration.client_steps import front_end_seconds

    assert front_end_seconds(jittered.requests, KNOWN) == pytest.approx(LAG - 5e-4, abs=1e-9)
    assert front_end_seconds(jittered.requests, KNOWN, JITTER.quantiles) == pytest.approx(LAG, abs=1e-9)
