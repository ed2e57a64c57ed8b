"""The searches' arithmetic: bisection for the highest concurrency meeting a test, doubling past
a limit, and doubling or halving then bisection for the highest rate (kvplan.run.sim.search
says what the tests are). Each returns the answer and the lowest value seen failing above it."""

from __future__ import annotations

from collections.abc import Callable

RATE_PRECISION = 1.02  # the rate search stops when the bracket is within 2 %
FIRST_STEP_DOWN = 1.25  # a rate search whose start fails tries start / 1.25 first, then halves
MAX_RATE_STEPS = 24


def round_rate(rate: float) -> float:
    """A rate rounded to 4 significant digits, the way a workload would name it."""
    return float(f"{rate:.4g}")


def _bisect(ok: Callable[[int], bool], low: int, high: int, precision: float) -> tuple[int, int]:
    """Narrow [low, high] (ok(low) holds, ok(high) fails) to adjacent integers or to within
    ``precision`` (a ratio): (the highest n seen holding, the lowest seen failing)."""
    while high - low > 1 and high > low * precision:
        mid = (low + high) // 2
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low, high


def highest_int(ok: Callable[[int], bool], top: int, precision: float = 1.0) -> tuple[int | None, int | None]:
    """(the highest n in [1, top] with ok(n), the lowest n above it seen failing) by bisection (ok
    assumed to hold below some n), to within ``precision`` (a ratio; 1.0: exactly): top first, the
    common answer on a GPU with room to spare."""
    if ok(top):
        return top, None
    if top == 1 or not ok(1):
        return None, 1 if top > 1 else top
    low, high = 1, top
    return _bisect(ok, low, high, precision)


def beyond(ok: Callable[[int], bool], low: int, cap: int, precision: float) -> tuple[int, int | None]:
    """From ``low`` (ok holds there), doubling up to ``cap``, then bisection to within
    ``precision``: (the highest n seen holding, the lowest above it seen failing; None: ``cap``
    holds)."""
    high = None
    while low < cap:
        nxt = min(2 * low, cap)
        if not ok(nxt):
            high = nxt
            break
        low = nxt
    if high is None:
        return low, None
    return _bisect(ok, low, high, precision)


def highest_rate(
    ok: Callable[[float], bool], start: float, top: float | None = None
) -> tuple[float | None, float | None]:
    """(the highest rate with ok(rate) to within RATE_PRECISION, the lowest rate above it seen
    failing), from ``start`` (requests/s). Rates are rounded to 4 significant digits, the way a
    workload would name them. ``top``: no rate above it is tried; when even ``top`` holds, it is
    the answer (with nothing above)."""
    rnd = round_rate
    rate = rnd(start if top is None else min(start, top))
    if ok(rate):
        low, high = rate, None
        for _ in range(MAX_RATE_STEPS):
            nxt = rnd(low * 2) if top is None else min(rnd(low * 2), top)
            if nxt == low:
                break
            if not ok(nxt):
                high = nxt
                break
            low = nxt
        if high is None:
            return low, None
    else:
        high, low = rate, None
        for step in range(MAX_RATE_STEPS):
            # the answer is usually just below the start (the rate the best concurrency serves)
            lower = rnd(high / (FIRST_STEP_DOWN if step == 0 else 2))
            if ok(lower):
                low = lower
                break
            high = lower
        if low is None:
            return None, high
    assert low is not None and high is not None  # both ends of a bracket are set past the loops above
    while high / low > RATE_PRECISION:
        mid = rnd((low * high) ** 0.5)
        if mid in (low, high):
            break
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low, high
