"""Did the machine slow down part-way through a measured run? Such a run calibrates badly.

Steps of one batch shape (decode-only steps of the same number of requests: the same work every
time, up to the context they read) should take the same time from the start of a run to its end.
For every shape seen often enough, the median of its first ``window`` steps is the baseline; each
later run of ``window`` consecutive steps of that shape whose median is more than ``threshold``
times slower flags the first slow step of that run (another process taking the cores, thermal
throttling, a noisy neighbour)::

    decode x 8:  |== baseline 15 ms ==|...... 15 ms ......|== 24 ms (1.6x) ==|   <- warn: step 4,210
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WINDOW = 25
THRESHOLD = 1.25


@dataclass(frozen=True)
class Drift:
    """Steps of ``num_decode`` decoding requests took ``ratio`` x their baseline from ``step_index``
    (in level ``level``) on: ``baseline_ms`` -> ``slow_ms`` (medians)."""

    step_index: int
    level: str
    num_decode: int
    baseline_ms: float
    slow_ms: float

    @property
    def ratio(self) -> float:
        return self.slow_ms / self.baseline_ms

    def describe(self) -> str:
        return (
            f"step {self.step_index:,} ({self.level}): decode steps of {self.num_decode} requests took "
            f"{self.ratio:.2f}x as long as at the run's start ({self.slow_ms:.1f} ms against "
            f"{self.baseline_ms:.1f} ms); the machine slowed down part-way, so the run calibrates badly"
        )


def find_drift(steps: Sequence, window: int = WINDOW, threshold: float = THRESHOLD) -> list[Drift]:
    """Every batch shape's first slow run of ``window`` steps (see the module docstring), earliest
    first. ``steps``: StepRecords in run order."""
    by_shape: dict[int, list] = defaultdict(list)
    for s in steps:
        if s.num_prefill_tokens == 0 and s.num_decode_tokens > 0:
            by_shape[s.num_decode_tokens].append(s)
    found = []
    for num_decode, own in by_shape.items():
        if len(own) < 2 * window:
            continue
        seconds = np.array([s.end_time - s.start_time for s in own])
        baseline = float(np.median(seconds[:window]))
        slow_at = threshold * baseline
        for start in range(window, len(own) - window + 1):
            run = seconds[start : start + window]
            if baseline > 0 and float(np.median(run)) > slow_at:
                first = start + int(np.argmax(run > slow_at))  # the run's first slow step
                slow = float(np.median(seconds[first : first + window]))
                found.append(Drift(own[first].step_index, own[first].key.name, num_decode, baseline * 1e3, slow * 1e3))
                break
    return sorted(found, key=lambda d: d.step_index)
