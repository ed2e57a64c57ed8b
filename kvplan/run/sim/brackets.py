"""The searches' arithmetic: bisection for the highest concurrency meeting a test, doubling past
a limit, and doubling or halving then bisection for the highest rate (kvplan.run.sim.search
says what the tests are). Each returns the answer and the lowest value seen failing above it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RATE_PRECISION = 1.02  # the rate search stops when the bracket is within 2 %
FIRST_STEP_DOWN = 1.25  # a rate search whose start fails tries start / 1.25 first, then halves
MAX_RATE_STEPS = 24
STEER_TRIES = 3  # a steered search follows its guesses until this many were wrong
STEER_GUESSES = 8  # and simulates at most this many guessed values in all


def round_rate(rate: float) -> float:
    """A rate rounded to 4 significant digits, the way a workload would name it."""
    return float(f"{rate:.4g}")


def bisect(ok: Callable[[int], bool], low: int, high: int, precision: float) -> tuple[int, int]:
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
    return bisect(ok, low, high, precision)


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
    return bisect(ok, low, high, precision)


def highest_rate(
    ok: Callable[[float], bool], start: float, top: float | None = None, top_first: bool = False
) -> tuple[float | None, float | None]:
    """(the highest rate with ok(rate) to within RATE_PRECISION, the lowest rate above it seen
    failing), from ``start`` (requests/s). Rates are rounded to 4 significant digits, the way a
    workload would name them. ``top``: no rate above it is tried; when even ``top`` holds, it is
    the answer (with nothing above). ``top_first``: ``top`` is asked before ``start`` (where it
    likely holds: then no rate below it is asked); when it fails, the search goes on from ``start``
    as without it."""
    rnd = round_rate
    if top_first and top is not None and ok(top):
        return top, None
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


class _Unknown(Exception):
    """A search asked for a value neither simulated nor implied by those simulated (``steered``)."""

    def __init__(self, value: Any):
        super().__init__(value)
        self.value = value


def steered(
    search: Callable[[Callable[[Any], bool]], tuple[Any, Any]],
    ok: Callable[[Any], bool],
    known: dict[Any, bool],
    guess: Callable[[], float | None],
    tries: int = STEER_TRIES,
    ahead: Callable[[list[Any]], None] | None = None,
) -> tuple[Any, Any]:
    """``search(ok)``'s answer, a (highest holding, lowest failing) pair (``search``: one of the
    searches above with its other arguments bound), found by simulating fewer values where ``ok``
    is monotone (holds below some value, fails above it), as the searches assume.

    ``known`` holds the values tested so far (it gains those tested here). The search is run
    with a test that answers from them: a value's own result, else holds at or below the
    highest holding one, fails at or above the lowest failing one. Where that leaves a value
    open, ``guess()`` (the expected edge from the levels simulated so far) gives the answer the
    search would reach if the edge were there, and the end of that answer's pair not yet implied
    is simulated (the failing end first: a failing level stops early). Once both ends of the
    answer hold and fail as the search needs, every value the search asks is implied, so the
    answer is the search's own: its pair is decided by the values between them, none of which it
    asks. Without a guess, after ``tries`` simulated guesses that came out the other way, after
    ``STEER_GUESSES`` guessed values, or once two results contradict monotonicity (a holding
    value above a failing one: then nothing is inferred), the value the search asks is simulated,
    as the search itself would. ``ahead(ends)``: told both open ends of a guessed answer before
    the first is simulated (kvplan.run.sim.ahead simulates them side by side). A test that is not
    monotone at levels only one of the two simulates can give another pair (one holding, the next
    one failing) than the plain search's.
    Sources: the searches' monotone assumption is kvplan.run.sim.search's module docstring."""

    def tested(value: Any) -> bool:
        known[value] = ok(value)
        return known[value]

    def implied(value: Any) -> bool:
        if value in known:
            return known[value]
        held = max((v for v, k in known.items() if k), default=None)
        failed = min((v for v, k in known.items() if not k), default=None)
        if held is not None and failed is not None and held > failed:
            raise _Unknown(value)  # not monotone: simulate what the search asks
        if held is not None and value <= held:
            return True
        if failed is not None and value >= failed:
            return False
        raise _Unknown(value)

    guesses = STEER_GUESSES
    while True:
        try:
            return search(implied)
        except _Unknown as asked:
            wanted = asked.value
        edge = guess() if tries > 0 and guesses > 0 and _monotone(known) else None
        if edge is None:
            tested(wanted)
            continue

        def expected(value: Any, edge: float = edge) -> bool:
            try:
                return implied(value)
            except _Unknown:
                return value <= edge

        low, high = search(expected)
        open_ends = [v for v in (high, low) if v is not None and _is_open(implied, v)]
        if not open_ends:
            tested(wanted)
            continue
        if ahead is not None and len(open_ends) == 2:  # both ends to simulate: side by side
            ahead(open_ends)
        value, guesses = open_ends[0], guesses - 1
        if tested(value) != (value == low):
            tries -= 1


def _is_open(implied: Callable[[Any], bool], value: Any) -> bool:
    try:
        implied(value)
    except _Unknown:
        return True
    return False


def _monotone(known: dict[Any, bool]) -> bool:
    held = max((v for v, k in known.items() if k), default=None)
    failed = min((v for v, k in known.items() if not k), default=None)
    return held is None or failed is None or held < failed


def inside(edge: float, known: dict[Any, bool]) -> float | None:
    """``edge`` while it lies strictly between the highest value known to hold and the lowest known
    to fail (a fixed guess for ``steered``: once a result passes it, no more guessing), else None."""
    held = max((v for v, k in known.items() if k), default=None)
    failed = min((v for v, k in known.items() if not k), default=None)
    if (held is not None and edge <= held) or (failed is not None and edge >= failed):
        return None
    return edge
