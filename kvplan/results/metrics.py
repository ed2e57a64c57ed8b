"""Load-test metrics: pure functions of the recorded requests and steps.

The definitions are ``DEFINITIONS`` below (vLLM's benchmark definitions, pinned in
docs/metrics.md); the report prints them. A request is *completed* when it finished with
reason stop or length; latency statistics cover completed requests only. A request that
produced no token is a *failure*: counted, and kept out of TTFT. Rates divide by the level's
span, from its first arrival to its last finish.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import chain
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, computed_field

from kvplan.results.records import LevelKey, RequestRecord, StepRecord
from kvplan.results.steady import LevelPlan, window_steps

PERCENTILES = (50, 90, 95, 99)
DEFINITIONS = """\
- TTFT = time of the first output token - arrival time of the request.
- TPOT = (E2E latency - TTFT) / (output tokens - 1), per request; undefined (never 0) for
  one-token outputs.
- ITL = every gap between consecutive output tokens, pooled over requests.
- E2E latency = finish time - arrival time.
- Percentiles are over requests, each weighted once (numpy's default linear interpolation).
- Goodput = completed requests per second that meet every SLO given (TTFT, TPOT, E2E); a
  one-token request has no TPOT, so it cannot miss a TPOT SLO (vLLM counts its TPOT as 0).
- KV cache usage = used blocks / total blocks, sampled after every engine step.
- These follow vLLM's benchmark definitions (calculate_metrics in vllm/benchmarks/serve.py);
  other tools differ (some fold the first token into TPOT or average ITL per request).
"""
TARGET_DEFINITIONS = """\
- Against an HTTP server: a token's time is the arrival of the streamed chunk carrying it, and a
  chunk carrying k tokens counts as k tokens at its arrival (k - 1 gaps of 0 in ITL); TTFT ends
  at the first chunk carrying text or reasoning text (never a role-only or empty chunk). Failed
  requests (HTTP errors, timeouts, dropped connections, empty outputs) are counted by reason and
  kept out of every latency. Server preemptions and KV usage are read from its /metrics.
"""


def completed(r: RequestRecord) -> bool:
    return r.finish_reason in ("stop", "length") and r.num_output_tokens > 0


def ttft_s(r: RequestRecord) -> float | None:
    return r.token_times[0] - r.arrival_time if r.token_times else None


def e2e_s(r: RequestRecord) -> float:
    return r.finish_time - r.arrival_time


def tpot_s(r: RequestRecord) -> float | None:
    ttft = ttft_s(r)  # None exactly when there are no token times
    if r.num_output_tokens < 2 or ttft is None:
        return None
    return (e2e_s(r) - ttft) / (r.num_output_tokens - 1)


def itl_s(r: RequestRecord) -> list[float]:
    """Every gap between consecutive output tokens of ``r``, seconds (later minus earlier)."""
    return list(map(operator.sub, r.token_times[1:], r.token_times))


def kv_cache_usage(s: StepRecord) -> float:
    return s.num_used_blocks / s.num_total_blocks if s.num_total_blocks else 0.0


def held_blocks(s: StepRecord) -> int:
    """Blocks held while the step ran (``num_peak_used_blocks``); a step recorded before that
    field existed held at least its after-step count, ``num_used_blocks``."""
    peak = getattr(s, "num_peak_used_blocks", None)
    return s.num_used_blocks if peak is None else peak


class Slo(BaseModel):
    """Service-level objectives in milliseconds; any subset. Goodput counts requests meeting all.
    (The workload YAML's ``slo:`` section.)"""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    ttft_ms: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="The most a request's time to first token (TTFT: first output token - arrival) may"
        " take, ms; null = no TTFT limit.",
    )
    tpot_ms: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="The most a request's time per output token (TPOT: (E2E - TTFT) / (output tokens -"
        " 1)) may be, ms, which a one-token request cannot miss; null = no TPOT limit.",
    )
    e2e_ms: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="The most a request's end-to-end latency (E2E: finish - arrival) may take, ms; null ="
        " no E2E limit.",
    )


class _Summary(BaseModel):
    # frozen values of the run result; fields a newer kvplan adds are ignored when read back
    model_config = ConfigDict(frozen=True, extra="ignore")


class LatencyStats(_Summary):
    """Mean and percentiles of one latency, in milliseconds, over ``count`` values."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float


def latency_stats(values_s: Sequence[float]) -> LatencyStats | None:
    """Statistics of latencies given in seconds, reported in ms; None when there are none."""
    if len(values_s) == 0:
        return None
    ms = np.asarray(values_s, dtype=np.float64) * 1e3
    pcts = np.percentile(ms, PERCENTILES)  # linear interpolation (numpy's default)
    return LatencyStats(count=len(ms), mean=float(ms.mean()), **{f"p{q}": float(p) for q, p in zip(PERCENTILES, pcts)})


def meets_slo(r: RequestRecord, slo: Slo) -> bool:
    """True when a completed request is within every SLO given (ms)."""
    if not completed(r):
        return False
    ttft, tpot = ttft_s(r), tpot_s(r)
    assert ttft is not None  # a completed request has output tokens, so token times
    return not (
        (slo.ttft_ms is not None and ttft * 1e3 > slo.ttft_ms)
        or (slo.tpot_ms is not None and tpot is not None and tpot * 1e3 > slo.tpot_ms)
        or (slo.e2e_ms is not None and e2e_s(r) * 1e3 > slo.e2e_ms)
    )


class LevelSummary(_Summary):
    """Everything measured at one load level of one bucket (``level``: concurrency N for mode
    closed, requests/s for mode open). Rates are per second of the level's span; bytes are KV
    cache bytes (see kvplan.results.records.StepRecord for the four estimates)."""

    bucket: str
    mode: str
    level: int | float
    num_requests: int
    num_completed: int
    num_failed: int  # produced no token
    num_cannot_fit: int  # KV OOM: longer than max_model_len or than the whole cache
    num_oom: int  # memory errors raised by torch
    num_aborted: int
    duration_s: float
    ttft_ms: LatencyStats | None
    tpot_ms: LatencyStats | None
    itl_ms: LatencyStats | None
    e2e_ms: LatencyStats | None
    output_tokens_per_s: float | None
    total_tokens_per_s: float | None
    requests_per_s: float | None
    goodput_rps: float | None
    slo_attainment: float | None  # fraction of all requests meeting every SLO
    num_steps: int
    num_preemptions: int
    num_preempted_requests: int
    num_total_blocks: int
    peak_used_blocks: int  # most blocks held during a step (a request finishing in its first step counts)
    mean_used_blocks: float  # after each step
    peak_kv_usage: float  # peak_used_blocks' usage
    mean_kv_usage: float
    mean_queue_len: float
    max_queue_len: int
    peak_ideal_bytes: int
    peak_paged_bytes: int
    peak_contiguous_bytes: int
    peak_measured_bytes: int
    max_paged_error_bytes: int  # max over steps of |measured - paged|; 0 when paging is exact
    prefix_hit_rate: float | None  # hit / queried prompt tokens over the level's steps
    variant: str = ""  # "cached" | "uncached" when a shared_prefix run ran the level twice
    num_planned: int | None = None  # the bucket's num_requests; None when not known
    # A remote target (kvplan loadtest --target); None where the server does not expose it, never 0:
    server_preemptions: int | None = None  # from its /metrics counter, across the level
    server_peak_kv_usage: float | None = None  # highest KV usage read (0..1)
    server_mean_kv_usage: float | None = None
    num_errors: int = 0  # finish_reason error (a target's failed request)
    error_reasons: dict[str, int] = {}  # finish_detail -> count, for errors
    num_short_outputs: int = 0  # completed with fewer tokens than asked (a server that stopped early)
    requested_rate: float | None = None  # open loop: the level's requests/s
    achieved_rate: float | None = None  # open loop: requests/s as actually sent
    max_send_delay_ms: float | None = None  # open loop, target: latest send after its scheduled arrival
    # A steady-state level (kvplan.results.steady): requests kept out of every statistic (warm-up,
    # cool-down) and the measured window, seconds from the level's first arrival
    num_excluded: int = 0
    window_start_s: float | None = None
    window_end_s: float | None = None

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented idiom; mypy rejects it
    @property
    def partial(self) -> bool:
        """Fewer requests finished than were planned (the run was stopped during this level)."""
        return self.num_planned is not None and self.num_requests < self.num_planned

    @property
    def key(self) -> LevelKey:
        return LevelKey.of(self)


def summarize_level(
    key: LevelKey,
    requests: Sequence[RequestRecord],
    steps: Sequence[StepRecord],
    slo: Slo,
    num_planned: int | None = None,
    plan: LevelPlan | None = None,
) -> LevelSummary:
    """Summarise one level (one variant of it) from its own request and step records;
    ``num_planned``: the requests the level was to run (the bucket's num_requests). ``plan``: a
    steady-state level's, whose warm-up and cool-down requests, and the steps outside the measured
    window, are kept out of every statistic (kvplan.results.steady)."""
    num_excluded, window = 0, None
    done = [r for r in requests if completed(r)]
    span = (max(r.finish_time for r in requests) - min(r.arrival_time for r in requests)) if requests else 0.0
    rate = (lambda n: n / span) if span > 0 else (lambda n: None)
    out_tokens = sum(r.num_output_tokens for r in done)
    all_tokens = sum(r.num_output_tokens + r.num_prompt_tokens for r in done)
    served = [(r, meets_slo(r, slo)) for r in done]
    if plan is not None and not plan.is_plain and requests:
        t0 = min(r.arrival_time for r in requests)
        requests, num_excluded, window = plan.split(requests)
        steps = window_steps(steps, t0, window) if window is not None else []
        num_planned = None if plan.duration_s is not None else num_planned
        # rates over the window (start, end], from every request's tokens and completions in it (a
        # warm-up or cool-down request's too: the load they put on the engine is the window's
        # load); its first instant is left out, the step whose completions sent the first request
        start, end = (t0 + window[0], t0 + window[1]) if window is not None else (0.0, 0.0)
        span = end - start
        rate = (lambda n: n / span) if span > 0 else (lambda n: None)
        out_tokens = sum(start < t <= end for r in done for t in r.token_times)
        prefilled = sum(r.num_prompt_tokens for r in done if r.token_times and start < r.token_times[0] <= end)
        all_tokens = out_tokens + prefilled
        served = [(r, good) for r, good in served if start < r.finish_time <= end]
        done = [r for r in requests if completed(r)]
    used = np.array([s.num_used_blocks for s in steps], dtype=np.float64)
    held = np.array([held_blocks(s) for s in steps], dtype=np.float64)  # during each step
    waiting = np.array([s.num_waiting for s in steps], dtype=np.float64)
    queried = sum(s.num_prefix_queried_tokens for s in steps)
    # steps without KV sizes (a simulation's search probes keep the scheduler's stats) count them as 0
    peak = lambda key: max((getattr(s, key, 0) for s in steps), default=0)  # noqa: E731
    errors = [r for r in requests if r.finish_reason == "error"]
    sent = sorted(r.sent_time if r.sent_time is not None else r.arrival_time for r in requests)
    is_open = key.mode == "open" and any(r.sent_time is not None for r in requests)  # a target's send times
    delays = [r.sent_time - r.arrival_time for r in requests if r.sent_time is not None]
    return LevelSummary(
        bucket=key.bucket,
        mode=key.mode,
        level=key.value,
        num_requests=len(requests),
        num_completed=len(done),
        num_failed=sum(r.num_output_tokens == 0 for r in requests),
        num_cannot_fit=sum(r.finish_reason == "cannot_fit" for r in requests),
        num_oom=sum(r.finish_reason == "oom" for r in requests),
        num_aborted=sum(r.finish_reason == "abort" for r in requests),
        duration_s=span,
        ttft_ms=latency_stats([t for r in done if (t := ttft_s(r)) is not None]),  # all: done are completed
        tpot_ms=latency_stats([t for r in done if (t := tpot_s(r)) is not None]),
        itl_ms=latency_stats(list(chain.from_iterable(map(itl_s, done)))),
        e2e_ms=latency_stats([e2e_s(r) for r in done]),
        output_tokens_per_s=rate(out_tokens),
        total_tokens_per_s=rate(all_tokens),
        requests_per_s=rate(len(served)),
        goodput_rps=rate(sum(good for _, good in served)),
        slo_attainment=(sum(meets_slo(r, slo) for r in requests) / len(requests)) if requests else None,
        num_steps=len(steps),
        num_preemptions=sum(s.num_preemptions for s in steps),
        num_preempted_requests=sum(r.num_preemptions > 0 for r in requests),
        num_total_blocks=peak("num_total_blocks"),
        peak_used_blocks=int(held.max()) if held.size else 0,
        mean_used_blocks=float(used.mean()) if used.size else 0.0,
        peak_kv_usage=max((held_blocks(s) / s.num_total_blocks for s in steps if s.num_total_blocks), default=0.0),
        mean_kv_usage=float(np.mean([kv_cache_usage(s) for s in steps])) if steps else 0.0,
        mean_queue_len=float(waiting.mean()) if waiting.size else 0.0,
        max_queue_len=int(waiting.max()) if waiting.size else 0,
        peak_ideal_bytes=peak("ideal_bytes"),
        peak_paged_bytes=peak("paged_bytes"),
        peak_contiguous_bytes=peak("contiguous_bytes"),
        peak_measured_bytes=peak("measured_bytes"),
        max_paged_error_bytes=max(
            (abs(getattr(s, "measured_bytes", 0) - getattr(s, "paged_bytes", 0)) for s in steps), default=0
        ),
        prefix_hit_rate=(sum(s.num_prefix_hit_tokens for s in steps) / queried) if queried else None,
        variant=key.variant,
        num_planned=num_planned,
        num_errors=len(errors),
        error_reasons={d: sum(r.finish_detail == d for r in errors) for d in sorted({r.finish_detail for r in errors})},
        num_short_outputs=sum(r.num_output_tokens < r.max_tokens for r in done),
        requested_rate=float(key.value) if is_open else None,
        achieved_rate=(len(sent) - 1) / (sent[-1] - sent[0])
        if is_open and len(sent) > 1 and sent[-1] > sent[0]
        else None,
        max_send_delay_ms=max(delays) * 1e3 if is_open and delays else None,
        num_excluded=num_excluded,
        window_start_s=window[0] if window is not None else None,
        window_end_s=window[1] if window is not None else None,
    )


def summarize_levels(
    requests: Sequence[RequestRecord],
    steps: Sequence[StepRecord],
    slo: Slo,
    num_planned: dict[str, int] | None = None,
    plans: dict[str, LevelPlan] | None = None,
) -> list[LevelSummary]:
    """One summary per (bucket, mode, level, variant), in the order the levels first appear.
    ``num_planned``: bucket name -> its num_requests, the requests each of its levels was to run;
    ``plans``: bucket name -> its steady-state LevelPlan (plain buckets absent)."""
    by_key: dict[LevelKey, tuple[list[RequestRecord], list[StepRecord]]] = {}
    records: list[StepRecord | RequestRecord] = [*steps, *requests]
    for rec in records:  # steps first: the order the levels ran in
        by_key.setdefault(rec.key, ([], []))
    for r in requests:
        by_key[r.key][0].append(r)
    for s in steps:
        by_key[s.key][1].append(s)
    return [
        summarize_level(k, own_requests, own_steps, slo, (num_planned or {}).get(k.bucket), (plans or {}).get(k.bucket))
        for k, (own_requests, own_steps) in by_key.items()
    ]


def preemptions(s: LevelSummary) -> int | None:
    """The level's preemptions: the engine's steps, or for a remote target (no steps) its server's
    /metrics (None when the server does not expose them)."""
    return s.server_preemptions if s.num_steps == 0 else s.num_preemptions


def measured_knee(levels: Sequence[LevelSummary]) -> int | None:
    """The lowest closed-loop concurrency level at which preemptions appeared (None: none did,
    or none could be seen)."""
    hit = [int(s.level) for s in levels if s.mode == "closed" and (preemptions(s) or 0) > 0]
    return min(hit) if hit else None


def clean(s: LevelSummary) -> bool:
    """No preemption, and every request the level was to run completed: a level where requests
    failed, could not fit or were never run (a stopped run), or whose preemptions cannot be seen,
    proves nothing about capacity."""
    planned = s.num_planned if s.num_planned is not None else s.num_requests
    return preemptions(s) == 0 and 0 < planned == s.num_completed


def max_clean_concurrency(levels: Sequence[LevelSummary]) -> int | None:
    """The highest closed-loop level below the knee that ran clean (see ``clean``; None: none)."""
    knee = measured_knee(levels)
    clean_levels = [
        int(s.level) for s in levels if s.mode == "closed" and clean(s) and (knee is None or s.level < knee)
    ]
    return max(clean_levels) if clean_levels else None


def p95_request_tokens(total_tokens: Sequence[int]) -> int:
    """P95 of per-request length (prompt + output tokens), rounded up to a whole token."""
    return int(np.ceil(np.percentile(np.asarray(total_tokens), 95))) if len(total_tokens) else 0
