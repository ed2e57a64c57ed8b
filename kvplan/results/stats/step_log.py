"""A simulated level's steps kept as columns: what a capacity probe's summary reads, with no object
per step of a decode run.

A simulation reports its steps as the scheduler's ``StepStats``, one per step, or as a decode
run (engine.outputs.DecodeRunSteps: many decode-only steps described by the first and the growth
per step, each StepStats built only where it is read). ``StepLog`` keeps both in order; iterating
it gives every step's StepStats, and ``columns()`` the fields the level summary reads as arrays,
a run's built from its description (its start and end times, the blocks in use after each step,
the rest the same all through the run). ``StepColumns.fields()`` gives the summary's step fields,
value for value what kvplan.results.metrics computes from the steps one by one (the same numbers
in the same order into the same numpy reductions; tested on random levels).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from kvplan.results.stats.offload import SUMMED, OffloadSummary

_TIERS = ("num_host_blocks", "num_disk_blocks")
_BYTES = ("ideal_bytes", "paged_bytes", "contiguous_bytes", "measured_bytes")
# the fields read that are 0 in every step of a decode run
_ZERO_IN_RUNS = ("num_preemptions", "num_prefix_queried_tokens", "num_prefix_hit_tokens", *SUMMED, *_BYTES)


def is_run(steps: Any) -> bool:
    """Whether ``steps`` is a decode run's (engine.outputs.DecodeRunSteps), not a list of steps."""
    return hasattr(steps, "taken_steps")


class StepLog:
    """A level's steps in order, as ``SimBackend.advance`` reports them (lists of StepStats, and
    decode runs); ``num_preemptions``: the preemptions among them so far."""

    def __init__(self) -> None:
        self._parts: list[Any] = []  # a decode run, or a list of step objects
        self._len = 0
        self.num_preemptions = 0

    def extend(self, steps: Any) -> None:
        """Add the steps of one report: a decode run, or a sequence of step objects."""
        if is_run(steps):
            self._parts.append(steps)
        elif steps:
            if not self._parts or is_run(self._parts[-1]):
                self._parts.append([])
            self._parts[-1].extend(steps)
            self.num_preemptions += sum(s.num_preemptions for s in steps)
        self._len += len(steps)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Any]:
        return chain.from_iterable(self._parts)

    def columns(self) -> StepColumns:
        """Every step's fields the summary reads, as arrays."""
        parts = self._parts
        start = _floats(chain.from_iterable(p.starts if is_run(p) else (s.start_time for s in p) for p in parts))
        end = _floats(chain.from_iterable(p.ends if is_run(p) else (s.end_time for s in p) for p in parts))
        used_parts = [_run_used(p) if is_run(p) else _ints(s.num_used_blocks for s in p) for p in parts]
        used = _joined(used_parts)  # a run's blocks held during each step are those in use after it
        held = _joined([u if is_run(p) else _ints(map(_held, p)) for p, u in zip(parts, used_parts)])

        def column(name: str, in_run: Any) -> np.ndarray:
            """Field ``name`` of every step; ``in_run(run)``: its value all through a run."""
            return _joined(
                [
                    np.full(len(p), in_run(p), dtype=np.int64) if is_run(p) else _ints(getattr(s, name, 0) for s in p)
                    for p in parts
                ]
            )

        counts = {
            "num_total_blocks": column("num_total_blocks", lambda run: run.num_total_blocks),
            "num_waiting": column("num_waiting", lambda run: run.num_waiting),
        }
        for name in _ZERO_IN_RUNS:
            counts[name] = column(name, lambda run: 0)
        for name in _TIERS:  # a run's tiers hold what they held at its start
            counts[name] = column(name, lambda run, name=name: run.columns.get(name, 0))
        return StepColumns(start, end, used, held, counts)


def _joined(pieces: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def _run_used(run: Any) -> np.ndarray:
    """The blocks in use after each step of a decode run (also those held during it)."""
    taken = np.asarray(run.taken_steps, dtype=np.int64)
    return run.used + np.searchsorted(taken, np.arange(len(run), dtype=np.int64), side="right")


def _held(s: Any) -> int:
    peak = getattr(s, "num_peak_used_blocks", None)
    return s.num_used_blocks if peak is None else peak


def _floats(values: Iterable[float]) -> np.ndarray:
    return np.fromiter(values, dtype=np.float64)


def _ints(values: Iterable[int]) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64)


@dataclass
class StepColumns:
    """Steps as arrays [num_steps]: ``start``, ``end`` (seconds), ``used`` (blocks in use after
    each), ``held`` (blocks held during each) and ``counts``: field name -> ints."""

    start: np.ndarray
    end: np.ndarray
    used: np.ndarray
    held: np.ndarray
    counts: dict[str, np.ndarray] = field(default_factory=dict)

    def within(self, start: float, end: float) -> StepColumns:
        """The steps ending after ``start`` and starting before ``end`` (as
        kvplan.results.stats.steady.window_steps keeps them)."""
        keep = (self.end > start) & (self.start < end)
        return StepColumns(
            self.start[keep],
            self.end[keep],
            self.used[keep],
            self.held[keep],
            {k: v[keep] for k, v in self.counts.items()},
        )

    def fields(self) -> dict[str, Any]:
        """LevelSummary's step fields (kvplan.results.metrics.step_fields computes them from step
        objects): the same values."""
        c = self.counts
        total = c["num_total_blocks"]
        used = self.used.astype(np.float64)
        held = self.held.astype(np.float64)
        waiting = c["num_waiting"].astype(np.float64)
        queried = int(c["num_prefix_queried_tokens"].sum())
        has_total = total != 0
        usage = np.zeros(len(total), dtype=np.float64)
        np.divide(self.used, total, out=usage, where=has_total)
        paged_error = np.abs(c["measured_bytes"] - c["paged_bytes"])
        return {
            "num_steps": len(total),
            "num_preemptions": int(c["num_preemptions"].sum()),
            "num_total_blocks": _peak(total),
            "peak_used_blocks": int(held.max()) if held.size else 0,
            "mean_used_blocks": float(used.mean()) if used.size else 0.0,
            "peak_kv_usage": float((self.held[has_total] / total[has_total]).max()) if has_total.any() else 0.0,
            "mean_kv_usage": float(np.mean(usage)) if len(total) else 0.0,
            "mean_queue_len": float(waiting.mean()) if waiting.size else 0.0,
            "max_queue_len": int(waiting.max()) if waiting.size else 0,
            "peak_ideal_bytes": _peak(c["ideal_bytes"]),
            "peak_paged_bytes": _peak(c["paged_bytes"]),
            "peak_contiguous_bytes": _peak(c["contiguous_bytes"]),
            "peak_measured_bytes": _peak(c["measured_bytes"]),
            "max_paged_error_bytes": _peak(paged_error),
            "prefix_hit_rate": (int(c["num_prefix_hit_tokens"].sum()) / queried) if queried else None,
            "offload": self._offload(),
        }

    def _offload(self) -> OffloadSummary | None:
        """kvplan.results.stats.offload.offload_summary, from the columns."""
        c = self.counts
        sums = {name: int(c[name].sum()) for name in SUMMED}
        peaks = {f"peak_{t}_blocks": _peak(c[f"num_{t}_blocks"]) for t in ("host", "disk")}
        if not any(sums.values()) and not any(peaks.values()):
            return None
        hits = int(c["num_prefix_hit_tokens"].sum())
        return OffloadSummary(
            device_hit_tokens=hits - sums["num_host_hit_tokens"] - sums["num_disk_hit_tokens"], **sums, **peaks
        )


def _peak(values: np.ndarray) -> int:
    return int(values.max()) if values.size else 0
