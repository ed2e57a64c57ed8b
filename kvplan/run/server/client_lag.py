"""When has the load client fallen behind? Its own delay judged against what a level measures.

The client's event loop fires a timer every ``LAG_TICK_S`` (kvplan.run.server.client); how late
each tick fires is how long the loop was busy, and a chunk that arrived meanwhile is stamped that
much late at most. A late tick covers the time the loop was blocked, so each lateness L is
weighted by the time its tick spans (tick + L): over that span a chunk arriving at a random
moment is stamped late by between 0 and L (uniformly, the block ending when the tick fires)::

    P(a chunk's stamp is late by more than x) = sum_i max(0, L_i - x) / sum_i (tick + L_i)
    stamp_delay_p99 = the x where that is 1 %

A 50 ms stall once a second is one tick in about 190, invisible to a P99 over ticks, yet it is
5 % of the time and delays that share of chunks by up to 50 ms; a steady 1 ms lag gives a
stamp_delay_p99 of about 1 ms either way.

The rule (docs/target.md, "The client's own cost"): a level is *behind* when

- ``stamp_delay_p99 > 5 %`` of the level's TTFT P50 (the client's error is a material share of
  the smallest latency it reports), or
- open loop: the P99 of its sends' delays after their scheduled arrivals exceeds a tenth of the
  mean inter-arrival time (1 / rate), so the arrival process sent is not the one asked for.

The raw lag (P99 and max over ticks) is kept beside it in the report either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LAG_SHARE_OF_TTFT = 0.05
SEND_SHARE_OF_GAP = 0.1


def stamp_delay_quantile(lags_s: Sequence[float], tick_s: float, q: float = 0.99) -> float | None:
    """The time-weighted ``q`` quantile of a chunk's stamp delay, s (see the module docstring);
    None without lag samples. ``lags_s``: each tick's lateness (>= 0), s."""
    lags = np.clip(np.asarray(lags_s, dtype=np.float64), 0.0, None)
    if lags.size == 0:
        return None
    total = float(np.sum(tick_s + lags))
    share = 1.0 - q

    def late_share(x: float) -> float:
        return float(np.sum(np.clip(lags - x, 0.0, None))) / total

    if late_share(0.0) <= share:
        return 0.0
    low, high = 0.0, float(lags.max())
    for _ in range(60):  # bisection on a decreasing piecewise-linear function: ~1e-18 s of its max
        mid = (low + high) / 2
        low, high = (mid, high) if late_share(mid) > share else (low, mid)
    return (low + high) / 2


def judge(
    stamp_delay_p99_ms: float | None,
    ttft_p50_ms: float | None,
    send_delay_p99_ms: float | None,
    mean_interarrival_ms: float | None,
) -> str:
    """Why the level is behind by the module's rule, or "" when it is not (or cannot be told:
    no TTFT measured, no lag sample, a closed-loop level's sends)."""
    reasons = []
    if stamp_delay_p99_ms is not None and ttft_p50_ms and stamp_delay_p99_ms > LAG_SHARE_OF_TTFT * ttft_p50_ms:
        reasons.append(
            f"stamp delay P99 {stamp_delay_p99_ms:.3g} ms > {LAG_SHARE_OF_TTFT:.0%} of TTFT P50 {ttft_p50_ms:.3g} ms"
        )
    if (
        send_delay_p99_ms is not None
        and mean_interarrival_ms
        and send_delay_p99_ms > SEND_SHARE_OF_GAP * mean_interarrival_ms
    ):
        reasons.append(
            f"sends late by P99 {send_delay_p99_ms:.3g} ms > {SEND_SHARE_OF_GAP:g} x the mean gap"
            f" {mean_interarrival_ms:.3g} ms"
        )
    return "; ".join(reasons)


def p99_ms(values_s: Sequence[float]) -> float | None:
    """P99 of ``values_s`` (s) in ms, numpy's linear interpolation; None when empty."""
    return float(np.percentile(np.asarray(values_s) * 1e3, 99)) if len(values_s) else None
