"""Load over time (``kvplan profile``'s ``load``): requests arriving per minute, and per hour for a
log spanning more than ``HOURLY_AFTER_S``, with the peak and the P99 minute.

Windows start at the log's first arrival: minute k holds the arrivals in [first + 60 k,
first + 60 (k + 1)) s, hour k those in [first + 3600 k, first + 3600 (k + 1)) s; the last window
ends past the last arrival, so it may be partial (and read low). A window without an arrival counts
0, so quiet minutes pull the percentiles down as they do in the traffic. Percentiles are numpy's
(linear interpolation) over the per-minute counts; the peak is the first window holding the most.
The counts themselves are listed up to ``MAX_LISTED`` windows (two weeks of minutes; null beyond).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MINUTE_S = 60.0
HOUR_S = 3600.0
HOURLY_AFTER_S = 2 * HOUR_S  # a log longer than this is also counted per hour
MAX_LISTED = 20_160  # windows listed in ``per_minute`` / ``per_hour``
MAX_DENSE = 1 << 22  # windows counted in an array; past this (a log over years) only the busy ones


def window_counts(arrivals_s: np.ndarray, window_s: float) -> tuple[np.ndarray, np.ndarray, int]:
    """The windows of ``window_s`` seconds from the first arrival (sorted arrivals) that hold an
    arrival, their counts, and the number of windows in all."""
    index = np.floor((arrivals_s - arrivals_s[0]) / window_s).astype(np.int64)
    starts = np.flatnonzero(np.diff(index, prepend=-1))
    counts = np.diff(np.append(starts, len(index)))
    return index[starts], counts, int(index[-1]) + 1


def _percentiles(busy: np.ndarray, counts: np.ndarray, total: int, qs: list[float]) -> list[float]:
    """numpy's percentiles of the counts of ``total`` windows, 0 where not ``busy``."""
    if total <= MAX_DENSE:
        dense = np.zeros(total, dtype=np.int64)
        dense[busy] = counts
        return [float(v) for v in np.percentile(dense, qs)]
    values = np.sort(counts)  # the zeros first, then these
    zeros, out = total - len(values), []
    for q in qs:
        at = q / 100 * (total - 1)
        low = math.floor(at)
        a, b = (float(values[i - zeros]) if i >= zeros else 0.0 for i in (low, min(low + 1, total - 1)))
        out.append(a + (b - a) * (at - low))
    return out


def _listed(busy: np.ndarray, counts: np.ndarray, total: int) -> list[int] | None:
    if total > MAX_LISTED:
        return None
    dense = [0] * total
    for k, c in zip(busy.tolist(), counts.tolist()):
        dense[k] = c
    return dense


def load_over_time(arrivals_s: np.ndarray) -> dict[str, Any]:
    """``{"load": ...}``: the per-minute (and, past ``HOURLY_AFTER_S``, per-hour) arrival counts and
    their summary (see the module docstring; arrivals in s, sorted, at least one)."""
    busy, counts, total = window_counts(arrivals_s, MINUTE_S)
    p50, p99 = _percentiles(busy, counts, total, [50, 99])
    span = float(arrivals_s[-1] - arrivals_s[0])
    load: dict[str, Any] = {
        "start_s": float(arrivals_s[0]),
        "num_minutes": total,
        "peak_per_minute": int(counts.max()),
        "peak_minute": int(busy[np.argmax(counts)]),
        "p99_per_minute": p99,
        "p50_per_minute": p50,
        "mean_per_minute": len(arrivals_s) / total,
        "per_minute": _listed(busy, counts, total),
        "num_hours": None,
        "peak_per_hour": None,
        "peak_hour": None,
        "per_hour": None,
    }
    if span > HOURLY_AFTER_S:
        busy_h, counts_h, hours = window_counts(arrivals_s, HOUR_S)
        load |= {
            "num_hours": hours,
            "peak_per_hour": int(counts_h.max()),
            "peak_hour": int(busy_h[np.argmax(counts_h)]),
            "per_hour": _listed(busy_h, counts_h, hours),
        }
    return {"load": load}
