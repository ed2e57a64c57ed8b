"""The step-time fit, by numbers made to obey it: the coefficients come back, R² is 1, held-out
levels are predicted, outliers and negative coefficients are dropped; the drift check flags the
first slow step of a batch shape; a shipped calibration refits to its own coefficients."""

from dataclasses import dataclass

import numpy as np
import pytest

from kvplan.results.records import LevelKey
from kvplan.run.sim.calibration import store as calibrations
from kvplan.run.sim.calibration.drift import find_drift
from kvplan.run.sim.calibration.fit import FEATURES, StepSample, fit_samples
from kvplan.run.sim.cost import StepWork

TRUE = {
    "intercept": 4e-3,
    "num_prefill_tokens": 30e-6,
    "num_decode_tokens": 150e-6,
    "num_prefill_seqs": 1e-3,
    "num_context_tokens": 2e-6,
    "num_attended_tokens": 5e-9,
}


def seconds(work: StepWork) -> float:
    return TRUE["intercept"] + sum(TRUE[f] * getattr(work, f) for f in FEATURES)


def made_up_steps(seed: int = 0, n: int = 400) -> list[StepSample]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        decode = int(rng.integers(0, 32))
        prefill_seqs = int(rng.integers(0, 3))
        prefill = int(rng.integers(1, 300)) * prefill_seqs
        context = decode * int(rng.integers(10, 400)) + prefill + int(rng.integers(0, 200)) * prefill_seqs
        attended = context * 3 + prefill * prefill // 2
        work = StepWork(prefill, decode if decode or prefill else 1, prefill_seqs, context, attended)
        out.append(StepSample(f"level {i % 4}", work, seconds(work), 0.5e-3))
    return out


def test_the_fit_recovers_the_coefficients_that_made_the_steps():
    fit = fit_samples(made_up_steps())
    assert fit.model.intercept_s == pytest.approx(TRUE["intercept"], rel=1e-6)
    for name in FEATURES:
        assert fit.model.coefficients[name] == pytest.approx(TRUE[name], rel=1e-5), name
    assert fit.model.gap_s == pytest.approx(0.5e-3)
    assert fit.r2 == pytest.approx(1.0) and fit.num_outliers == 0
    assert [e.level for e in fit.held_out] == ["level 0", "level 1", "level 2", "level 3"]
    assert all(abs(e.median_abs_step_error_pct) < 1e-6 and abs(e.total_error_pct) < 1e-6 for e in fit.held_out)


def test_outliers_are_dropped_and_a_negative_coefficient_is_left_out():
    steps = made_up_steps()
    # a garbage collection made 5 steps take 50 ms longer
    steps = [
        StepSample(s.level, s.work, s.seconds + (0.05 if i % 80 == 0 else 0), s.gap_s) for i, s in enumerate(steps)
    ]
    fit = fit_samples(steps, held_out=False)
    assert fit.num_outliers == 5
    assert fit.model.coefficients["num_decode_tokens"] == pytest.approx(TRUE["num_decode_tokens"], rel=1e-5)
    # steps that get faster with context: the context coefficient would be negative; it is dropped
    faster = [
        StepSample(s.level, s.work, 0.01 + 1e-4 * s.work.num_decode_tokens - 1e-7 * s.work.num_context_tokens, None)
        for s in made_up_steps()
    ]
    assert "num_context_tokens" not in fit_samples(faster, held_out=False).model.coefficients


@dataclass
class Step:  # the StepRecord fields the drift check reads
    step_index: int
    start_time: float
    end_time: float
    num_prefill_tokens: int
    num_decode_tokens: int
    key: LevelKey


def test_drift_names_the_first_step_where_a_shape_got_slower():
    steps, t = [], 0.0
    for i in range(300):
        slow = 1.5 if i >= 180 else 1.0  # the machine slowed down at step 180
        decode = 8 if i % 2 else 4
        duration = (0.010 + 0.001 * decode) * slow
        steps.append(Step(i, t, t + duration, 0, decode, LevelKey("short", "closed", 8)))
        t += duration
    drift = find_drift(steps)
    assert [(d.step_index, d.num_decode) for d in drift] == [(180, 4), (181, 8)]
    assert drift[0].ratio == pytest.approx(1.5)
    assert drift[0].describe().startswith("step 180 (short c=8): decode steps of 4 requests took 1.50x as long")
    steady = [
        Step(s.step_index, 0.0, (0.010 + 0.001 * s.num_decode_tokens), 0, s.num_decode_tokens, s.key) for s in steps
    ]
    assert find_drift(steady) == []


@pytest.mark.parametrize("path", sorted(calibrations.DATA_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_a_shipped_calibration_refits_to_its_own_coefficients(path):
    shipped = calibrations.load(path)
    samples = calibrations.load_samples(path)
    fit = fit_samples(samples, held_out=False)
    assert fit.num_steps == shipped.num_steps and fit.r2 == pytest.approx(shipped.r2, rel=1e-6)
    assert fit.model.intercept_s == pytest.approx(shipped.model.intercept_s, rel=1e-6, abs=1e-12)
    assert fit.model.coefficients.keys() == shipped.model.coefficients.keys()
    for name, value in shipped.model.coefficients.items():
        assert fit.model.coefficients[name] == pytest.approx(value, rel=1e-6)
    assert fit.model.gap_s == pytest.approx(shipped.model.gap_s, rel=1e-6)
    assert shipped.machine and shipped.source
