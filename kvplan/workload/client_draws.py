"""How AIPerf and GuideLLM draw a request's token lengths and split a level's requests, as
kvplan Lengths and counts (the ``aiperf`` and ``guidellm`` kinds of kvplan.workload.protocol).

Each formula was read in the client's wheel; a length is a token count, a count is requests.

AIPerf 0.13.0 (aiperf/common/random_generator.py ``sample_positive_normal_integer`` and
``sample_normal``; aiperf/dataset/composer/synthetic.py and base.py, which pass the mean and the
stddev through ``int()``)::

    stddev <= 0   length = max(1, round(mean))
    stddev > 0    length = max(1, ceil(x)), x ~ Normal(mean, stddev) redrawn while x < 0

ceil(x) has the distribution of rint(x + 0.5) (they differ only where x + 0.5 is a whole
number, which has probability 0), so kvplan's ``normal`` Lengths (kvplan.traffic.prompts
``draw_lengths``: clip(rint(Normal(center, std)), min, max)) with center = mean + 0.5, min 1 and a
max 10 stddevs above reproduces it, except below 0: AIPerf redraws an x < 0 (the whole
distribution renormalised over x >= 0), kvplan counts it as length 1. That differs from AIPerf by
at most P(x < 0) = Phi(-mean / stddev) of the draws (2.9e-7 at mean = 5 stddevs); the clip
at the top drops Phi(-10) ~ 1e-23.

GuideLLM 0.8.1 (guidellm/utils/random.py ``IntegerRangeSampler``, fed ``prompt_tokens``,
``prompt_tokens_stdev``, ``prompt_tokens_min``, ``prompt_tokens_max`` and the same for output by
guidellm/data/deserializers/synthetic.py)::

    lo = min if given, else max(1, avg - 5 stdev) with a stdev, else max(1, avg)
    hi = max if given, else avg + 5 stdev with a stdev, else avg
    lo == hi      length = lo
    no stdev      length = uniform integer in [lo, hi]
    stdev         length = round(clamp(gauss(avg, stdev), lo, hi))

round(clamp(x, lo, hi)) = clip(rint(x), lo, hi) for whole lo and hi (both round half to even),
so kvplan's ``normal`` Lengths with mean avg, std stdev and the range [lo, hi] is the same draw.

GuideLLM's ``--warmup`` and ``--cooldown`` (guidellm/schemas/benchmark/transient.py
``TransientPhaseConfig``: ``create_from_value`` and ``compute_limits``) against ``--max-requests``
N: a value v < 1 is a fraction, int(v N) requests; v >= 1 is int(v) requests (or seconds with
``--max-seconds``, which kvplan's protocol does not take).
"""

from __future__ import annotations

import math

from kvplan.workload.lengths import MAX_TOKENS, Lengths

AIPERF_TAIL_STDDEVS = 10  # the top of an AIPerf length range: mean + this many stddevs (Phi(-10) ~ 1e-23 cut)


def aiperf_lengths(mean: int, stddev: int) -> Lengths:
    """The lengths AIPerf 0.13.0 draws for ``--isl``/``--osl`` ``mean`` and ``--isl-stddev``/
    ``--osl-stddev`` ``stddev`` (tokens; module docstring): fixed at max(1, mean) for stddev 0,
    else a normal of center mean + 0.5 in [1, mean + 10 stddevs]."""
    if stddev <= 0:
        return Lengths(min=max(1, mean), max=max(1, mean), dist="fixed")
    high = min(MAX_TOKENS, math.ceil(mean + AIPERF_TAIL_STDDEVS * stddev) + 1)
    return Lengths(min=1, max=high, dist="normal", mean=mean + 0.5, std=float(stddev))


def guidellm_lengths(average: int, stdev: int | None, low: int | None, high: int | None) -> Lengths:
    """The lengths GuideLLM 0.8.1's ``IntegerRangeSampler`` draws for ``average`` tokens with an
    optional ``stdev``, ``low`` (its ``*_min``) and ``high`` (``*_max``), tokens (module
    docstring).

    Raises:
        ValueError: the range is empty (lo > hi; GuideLLM's ``randint`` fails there), or with a
            stdev ``average`` lies outside it (kvplan's normal Lengths centres in its range).
    """
    lo = low if low is not None else max(1, average - 5 * stdev if stdev else average)
    hi = high if high is not None else (average + 5 * stdev if stdev else average)
    if lo > hi:
        raise ValueError(f"the length range [{lo}, {hi}] is empty: min must be <= max")
    if lo == hi:
        return Lengths(min=lo, max=hi, dist="fixed")
    if not stdev:
        return Lengths(min=lo, max=hi)
    if not lo <= average <= hi:
        raise ValueError(f"the average {average} lies outside [{lo}, {hi}]: widen min/max or move the average")
    return Lengths(min=lo, max=hi, dist="normal", mean=float(average), std=float(stdev))


def guidellm_transient(value: float, max_requests: int) -> int:
    """Requests in a GuideLLM warm-up or cool-down of ``value`` against ``--max-requests``
    ``max_requests``: int(value x max_requests) for a fraction (value < 1), else int(value)."""
    return int(value * max_requests) if value < 1 else int(value)
