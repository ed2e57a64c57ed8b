"""A step-time model fitted on a measured run's own steps, by least squares.

Each recorded step (``steps.jsonl``) carries the work it ran (kvplan.run.sim.cost.StepWork) and
its start and end. The model is linear in that work::

    step seconds = intercept + a x prefill tokens + b x decode tokens + c x prefill sequences
                              + d x context tokens (K/V read) + e x attended query-key pairs
    gap seconds  = median over consecutive steps of a level of (next start - this end)

Fitted by weighted least squares on relative error (weight 1 / measured seconds: a 20 ms decode
step counts as much as a 200 ms prefill), with no coefficient below zero (a feature whose
coefficient comes out negative is dropped and the rest refitted: an active-set approximation of
non-negative least squares), after dropping steps whose relative error lies over 4 median
absolute deviations (at least 0.5 % each) from the median (a garbage collection, another process
taking the core) in a second pass. ``r2`` is the coefficient
of determination of the step seconds; ``held_out`` refits without each level in turn and
predicts that level's steps, the honest error of the model on load it was not fitted on.

Steps read back from a server run's client-side token times (kvplan.run.sim.calibration.client_steps)
are fitted with ``mean``: ordinary least squares over all of them, so the model's total time is the
measured total (a slow step there is the server's own, and every latency the client measures
includes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvplan.run.sim.cost import StepWork, decode_work

_MIN_DEVIATION = 0.005  # relative; see fit_samples
FEATURES = ("num_prefill_tokens", "num_decode_tokens", "num_prefill_seqs", "num_context_tokens", "num_attended_tokens")
# a decode step's features that are its context (kvplan.run.sim.cost.decode_work)
_CONTEXT_FEATURES = ("num_context_tokens", "num_attended_tokens", "num_decode_context_tokens")


@dataclass(frozen=True)
class StepSample:
    """One measured step: its level (``LevelKey.name``), work and timing (seconds)."""

    level: str
    work: StepWork
    seconds: float
    gap_s: float | None  # until the next step of the same level starts; None for a level's last


@dataclass(frozen=True)
class LinearStepCost:
    """A CostModel (kvplan.run.sim.cost): ``intercept_s`` + coefficient x feature (seconds per
    token, sequence or query-key pair), and the gap between steps."""

    intercept_s: float
    coefficients: dict[str, float]
    gap_s: float

    def step_seconds(self, work: StepWork) -> float:
        return self.intercept_s + sum(c * getattr(work, name) for name, c in self.coefficients.items())

    def decode_seconds(self, n: int, contexts: np.ndarray) -> np.ndarray:
        """``step_seconds`` of decode-only steps of ``n`` decodes over each of ``contexts`` context
        tokens (kvplan.run.sim.cost.decode_work), float for float: the same products summed in
        the same order over the array."""
        work = decode_work(n, 0)
        total: Any = 0
        for name, c in self.coefficients.items():
            total = total + c * (contexts if name in _CONTEXT_FEATURES else getattr(work, name))
        return np.broadcast_to(np.asarray(self.intercept_s + total, dtype=np.float64), (len(contexts),)).copy()


@dataclass(frozen=True)
class LevelError:
    """The model, fitted without ``level``, on that level's steps: the median |error| of a
    step's seconds and the error of their sum (%; positive: predicted slower)."""

    level: str
    num_steps: int
    median_abs_step_error_pct: float
    total_error_pct: float


@dataclass(frozen=True)
class Fit:
    """A fitted model, how well it fits (``r2`` over ``num_steps`` kept, ``num_outliers``
    dropped) and its leave-one-level-out errors."""

    model: LinearStepCost
    r2: float
    num_steps: int
    num_outliers: int
    held_out: tuple[LevelError, ...]


def _matrix(samples: Sequence[StepSample]) -> np.ndarray:
    return np.array([[1.0, *(getattr(s.work, f) for f in FEATURES)] for s in samples], dtype=np.float64)


def _solve(x: np.ndarray, y: np.ndarray, relative: bool = True) -> np.ndarray:
    """Non-negative least squares of y on x's columns (weights 1/y where ``relative``), by dropping
    negative coefficients and refitting until none is left."""
    w = 1.0 / np.maximum(y, 1e-6) if relative else np.ones_like(y)
    active = [j for j in range(x.shape[1]) if np.any(x[:, j])]
    while True:
        coef = np.zeros(x.shape[1])
        if active:
            sol, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
            coef[active] = sol
        negative = [j for j in active if coef[j] < 0]
        if not negative:
            return coef
        active.remove(min(negative, key=lambda j: coef[j]))


def _model(coef: np.ndarray, gap_s: float) -> LinearStepCost:
    return LinearStepCost(float(coef[0]), {f: float(c) for f, c in zip(FEATURES, coef[1:]) if c > 0}, gap_s)


def fit_samples(samples: Sequence[StepSample], held_out: bool = True, mean: bool = False) -> Fit:
    """Fit the step-time model on ``samples`` (see the module docstring). ``mean``: ordinary least
    squares on every sample, no outlier dropped, so the model's total equals the measured total
    (with an intercept, least squares' residuals sum to zero): for steps seen from a client
    (kvplan.run.sim.calibration.client_steps), whose slow ones are the server's own and count in
    every latency the client measures.

    Raises:
        ValueError: fewer steps than the model has coefficients.
    """
    if len(samples) < len(FEATURES) + 1:
        raise ValueError(f"{len(samples)} steps are too few to fit {len(FEATURES) + 1} coefficients")
    x, y = _matrix(samples), np.array([s.seconds for s in samples])
    coef = _solve(x, y, relative=not mean)
    relative = (x @ coef - y) / y
    # a floor of 0.5 %: a fit that is exact up to rounding has no outliers
    deviation = max(float(np.median(np.abs(relative - np.median(relative)))), _MIN_DEVIATION)
    keep = np.abs(relative - np.median(relative)) <= 4 * deviation
    if mean:
        keep = np.ones_like(keep)
    coef = _solve(x[keep], y[keep], relative=not mean)
    gaps = [s.gap_s for s in samples if s.gap_s is not None]
    model = _model(coef, float(np.median(gaps)) if gaps else 0.0)
    predicted = x[keep] @ coef
    total = float(np.sum((y[keep] - y[keep].mean()) ** 2))
    r2 = 1.0 - float(np.sum((y[keep] - predicted) ** 2)) / total if total > 0 else 1.0
    errors = tuple(_held_out(samples, mean)) if held_out else ()
    return Fit(model, r2, int(keep.sum()), int((~keep).sum()), errors)


def _held_out(samples: Sequence[StepSample], mean: bool) -> list[LevelError]:
    levels = list(dict.fromkeys(s.level for s in samples))
    out = []
    for level in levels if len(levels) > 1 else []:
        own = [s for s in samples if s.level == level]
        rest = [s for s in samples if s.level != level]
        if len(rest) <= len(FEATURES):
            continue
        model = fit_samples(rest, held_out=False, mean=mean).model
        predicted = np.array([model.step_seconds(s.work) for s in own])
        measured = np.array([s.seconds for s in own])
        out.append(
            LevelError(
                level,
                len(own),
                float(np.median(np.abs(predicted / measured - 1))) * 100,
                float(predicted.sum() / measured.sum() - 1) * 100,
            )
        )
    return out


def samples_of(steps: Sequence) -> list[StepSample]:
    """StepSamples from a run's StepRecords (level order kept); the gap is to the next step of
    the same level."""
    out = []
    for i, s in enumerate(steps):
        following = steps[i + 1] if i + 1 < len(steps) else None
        out.append(
            StepSample(
                s.key.name,
                StepWork.of(s),
                s.end_time - s.start_time,
                following.start_time - s.end_time if following is not None and following.key == s.key else None,
            )
        )
    return out
