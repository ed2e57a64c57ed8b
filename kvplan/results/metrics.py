"""Load-test metrics: pure functions of the recorded requests and steps.

The definitions are kvplan.results.stats.latency's ``DEFINITIONS`` (vLLM's benchmark definitions, pinned
in docs/metrics.md); the report prints them. A request is *completed* when it finished with
reason stop or length; latency statistics cover completed requests only. A request that
produced no token is a *failure*: counted, and kept out of TTFT. Rates divide by the level's
span, from its first arrival to its last finish.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from operator import sub
from typing import Any

import numpy as np
from pydantic import Field, computed_field

from kvplan.results.records import LevelKey, RequestRecord, StepRecord
from kvplan.results.rows import by_level, column, pick
from kvplan.results.stats.arrival_stats import ArrivalSettings, level_arrival
from kvplan.results.stats.classes import ClassSummary, class_summaries
from kvplan.results.stats.latency import (  # noqa: F401  (re-exported: kvplan.results.metrics is their old home)
    DEFINITIONS,
    PERCENTILES,
    TARGET_DEFINITIONS,
    LatencyStats,
    Slo,
    _Summary,
    completed,
    e2e_s,
    held_blocks,
    itl_s,
    itls_s,
    kv_cache_usage,
    latency_stats,
    meets_slo,
    tpot_s,
    ttfo_s,
    ttft_s,
)
from kvplan.results.stats.offload import OffloadSummary, offload_summary
from kvplan.results.stats.shed import TenantShed, is_rejected, shed_fields
from kvplan.results.stats.steady import LevelSchedule, window_steps
from kvplan.results.stats.step_log import StepColumns, StepLog
from kvplan.results.stats.turns import TurnSummary, turn_summaries
from kvplan.results.stats.variants import is_alone


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
    achieved_rate: float | None = None  # open loop: requests/s as actually sent (a session level: sessions/s)
    max_send_delay_ms: float | None = None  # open loop, target: latest send after its scheduled arrival
    server_output_tokens: int | None = None  # the server's generated-token counter across the level
    server_prefix_hit_rate: float | None = Field(
        None,
        description="A target run's: the server's prefix-cache hit tokens over its queried prompt tokens across"
        " the level, 0..1 (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total); null where not exported.",
    )
    ttfo_ms: LatencyStats | None = Field(
        None, description="Time to first output (first answer, not reasoning, chunk), ms; null without reasoning."
    )
    # A steady-state level (kvplan.results.stats.steady): requests kept out of every statistic (warm-up,
    # cool-down) and the measured window, seconds from the level's first arrival
    num_excluded: int = 0
    window_start_s: float | None = None
    window_end_s: float | None = None
    # An open-loop level's arrivals (kvplan.results.stats.arrival_stats); None for closed loop: the process,
    # the inter-arrival CV it asks for (poisson 1, gamma 1/sqrt(burstiness), constant 0) and the CV of
    # the gaps between its requests' sorted arrival times (numpy std, ddof=0, / mean; None under 3)
    arrival_process: str | None = Field(None, description="Open loop: poisson, gamma or constant; null closed.")
    requested_cv: float | None = Field(None, description="Open loop: the inter-arrival CV asked for (1/sqrt(B)).")
    achieved_cv: float | None = Field(None, description="Open loop: the inter-arrival CV sent (std/mean, ddof 0).")
    classes: list[ClassSummary] = Field([], description="A mixed level's request classes; [] without a mix.")
    turns: list[TurnSummary] | None = Field(None, description="A session level's turns; null without sessions.")
    # admission (kvplan.results.stats.shed): requests refused at the entry, none unless admission is on
    num_rejected: int = Field(0, description="Requests refused at the entry (admission; a target's HTTP 429).")
    shed_fraction: float | None = Field(None, description="num_rejected / num_requests, 0..1; null without requests.")
    rejected_reasons: dict[str, int] = Field({}, description="Refusal reason (kv_budget, queue_full, ...) -> count.")
    tenants: list[TenantShed] = Field([], description="Per tenant: requests, refused, shed fraction; [] without.")
    offload: OffloadSummary | None = Field(
        None, description="The bundled engine's KV offload tiers: hits by tier, stores, loads, bytes; null when off."
    )

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
    steps: Sequence[StepRecord] | StepLog,
    slo: Slo,
    num_planned: int | None = None,
    plan: LevelSchedule | None = None,
    class_slos: Mapping[str, Slo] | None = None,
    arrival: ArrivalSettings | None = None,
    latencies_only: bool = False,
) -> LevelSummary:
    """Summarise one level (one variant of it) from its own request and step records;
    ``num_planned``: the requests the level was to run (the bucket's num_requests). ``plan``: a
    steady-state level's, whose warm-up and cool-down requests, and the steps outside the measured
    window, are kept out of every statistic (kvplan.results.stats.steady). ``class_slos``: mix class ->
    its SLO, for the classes judged by their own (the others by ``slo``). ``arrival``: the bucket's
    open-loop arrival settings (None: Poisson), whose CVs an open-loop level gets from all its
    requests, warm-up and cool-down included. ``latencies_only``: a simulated capacity probe's
    summary (kvplan.run.sim.search), which is read for its SLO attainment, rates and TTFT / TPOT /
    E2E stats only: no ITL stats (None) and no step fields (as of a level without steps: zeros),
    the work of its thousands of token gaps and steps left out."""
    own_slos = class_slos or {}
    slo_of = lambda r: own_slos.get(r.request_class, slo)  # noqa: E731
    num_excluded, window = 0, None
    arrivals = level_arrival(key, requests, arrival)  # before a steady-state plan splits the requests
    done = [r for r in requests if completed(r)]
    goods: dict[int, bool] = {}  # id(record) -> whether it meets its SLO, each judged once here

    def good(r: RequestRecord) -> bool:
        found = goods.get(id(r))
        if found is None:
            found = goods[id(r)] = meets_slo(r, slo_of(r))
        return found

    if plan is None or plan.is_plain or not requests:
        span = (max(r.finish_time for r in requests) - min(r.arrival_time for r in requests)) if requests else 0.0
        rate = (lambda n: n / span) if span > 0 else (lambda n: None)
        out_tokens = sum(r.num_output_tokens for r in done)
        all_tokens = sum(r.num_output_tokens + r.num_prompt_tokens for r in done)
        served = [(r, good(r)) for r in done]
    else:
        t0 = min(r.arrival_time for r in requests)
        requests, num_excluded, window = plan.split(requests)
        steps = window_steps(steps, t0, window) if window is not None and not latencies_only else []
        num_planned = None if plan.duration_s is not None else num_planned
        # rates over the window (start, end], from every request's tokens and completions in it (a
        # warm-up or cool-down request's too: the load they put on the engine is the window's
        # load); its first instant is left out, the step whose completions sent the first request
        start, end = (t0 + window[0], t0 + window[1]) if window is not None else (0.0, 0.0)
        span = end - start
        rate = (lambda n: n / span) if span > 0 else (lambda n: None)
        # a request's token times are in order (token i reaches the client after token i - 1):
        # its tokens in (start, end] are counted by two bisections, not read one by one
        out_tokens = sum(bisect_right(r.token_times, end) - bisect_right(r.token_times, start) for r in done)
        prefilled = sum(r.num_prompt_tokens for r in done if r.token_times and start < r.token_times[0] <= end)
        all_tokens = out_tokens + prefilled
        served = [(r, good(r)) for r in done if start < r.finish_time <= end]
        done = [r for r in requests if completed(r)]
    errors = [r for r in requests if r.finish_reason == "error"]
    # sent as the level's rate counts them: requests, or in a session level sessions (their first turns)
    sent = sorted(r.sent_time if r.sent_time is not None else r.arrival_time for r in requests if (r.turn or 1) == 1)
    is_open = key.mode == "open" and any(r.sent_time is not None for r in requests)  # a target's send times
    delays = [r.sent_time - r.arrival_time for r in requests if r.sent_time is not None]
    return LevelSummary(
        bucket=key.bucket,
        mode=key.mode,
        level=key.value,
        num_requests=len(requests),
        num_completed=len(done),
        num_failed=sum(r.num_output_tokens == 0 and not is_rejected(r) for r in requests),
        num_cannot_fit=sum(r.finish_reason == "cannot_fit" for r in requests),
        num_oom=sum(r.finish_reason == "oom" for r in requests),
        num_aborted=sum(r.finish_reason == "abort" for r in requests),
        duration_s=span,
        ttft_ms=latency_stats([t for r in done if (t := ttft_s(r)) is not None]),  # all: done are completed
        ttfo_ms=latency_stats([t for r in done if (t := ttfo_s(r)) is not None]),
        tpot_ms=latency_stats([t for r in done if (t := tpot_s(r)) is not None]),
        itl_ms=None if latencies_only else latency_stats(itls_s(done)),
        e2e_ms=latency_stats([e2e_s(r) for r in done]),
        output_tokens_per_s=rate(out_tokens),
        total_tokens_per_s=rate(all_tokens),
        requests_per_s=rate(len(served)),
        goodput_rps=rate(sum(good for _, good in served)),
        slo_attainment=(sum(map(good, requests)) / len(requests)) if requests else None,
        num_preempted_requests=sum(r.num_preemptions > 0 for r in requests),
        **step_fields([] if latencies_only else steps),
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
        **arrivals,
        classes=class_summaries(requests, served, rate, slo_of),
        turns=turn_summaries(requests),
        **shed_fields(requests),
    )


def step_fields(steps: Sequence[StepRecord] | StepLog | StepColumns) -> dict[str, Any]:
    """A level summary's fields read off its steps (step records, or a simulated probe's
    ``StepLog`` or ``StepColumns``, kvplan.results.stats.step_log: the same values from arrays)."""
    if isinstance(steps, StepLog):
        steps = steps.columns()
    if isinstance(steps, StepColumns):
        return steps.fields()
    # the steps' fields read column by column (kvplan.results.rows.column: a million steps of a long
    # simulation); each value as held_blocks and kv_cache_usage give it per step
    used_blocks, totals = column(steps, "num_used_blocks"), column(steps, "num_total_blocks")
    peaks = column(steps, "num_peak_used_blocks", None)
    held_blocks_ = peaks if None not in peaks else [u if p is None else p for u, p in zip(used_blocks, peaks)]
    used = np.array(used_blocks, dtype=np.float64)
    held = np.array(held_blocks_, dtype=np.float64)  # during each step
    waiting = np.array(column(steps, "num_waiting"), dtype=np.float64)
    queried = sum(column(steps, "num_prefix_queried_tokens"))
    # steps without KV sizes (a simulation's search probes keep the scheduler's stats) count them as 0
    peak = lambda key: max(column(steps, key, 0), default=0)  # noqa: E731
    return {
        "num_steps": len(steps),
        "num_preemptions": sum(column(steps, "num_preemptions")),
        "num_total_blocks": peak("num_total_blocks"),
        "peak_used_blocks": int(held.max()) if held.size else 0,
        "mean_used_blocks": float(used.mean()) if used.size else 0.0,
        **_kv_usage(used_blocks, held_blocks_, totals),
        "mean_queue_len": float(waiting.mean()) if waiting.size else 0.0,
        "max_queue_len": int(waiting.max()) if waiting.size else 0,
        "peak_ideal_bytes": peak("ideal_bytes"),
        "peak_paged_bytes": peak("paged_bytes"),
        "peak_contiguous_bytes": peak("contiguous_bytes"),
        "peak_measured_bytes": peak("measured_bytes"),
        "max_paged_error_bytes": max(
            map(abs, map(sub, column(steps, "measured_bytes", 0), column(steps, "paged_bytes", 0))), default=0
        ),
        "prefix_hit_rate": (sum(column(steps, "num_prefix_hit_tokens")) / queried) if queried else None,
        "offload": offload_summary(steps),
    }


def _kv_usage(used: Sequence[Any], held: Sequence[Any], totals: Sequence[Any]) -> dict[str, float]:
    """peak_kv_usage (the most held / total blocks over steps with blocks; 0.0 with none) and
    mean_kv_usage (used / total blocks, 0.0 for a step with none, averaged; 0.0 with no steps),
    each quotient as Python's true division makes it: in numpy where every count is an int below
    2**53 (exact as a float64, so the quotient is the same correctly rounded double; the mean the
    same sum over the same array), else one by one (a million steps of a long simulation: 0.6 s)."""
    arrays = [np.array(c) for c in (used, held, totals)]
    if len(used) and all(a.dtype.kind == "i" and -(2**53) < a.min() and a.max() < 2**53 for a in arrays):
        u, h, t = (a.astype(np.float64) for a in arrays)
        some = t != 0
        usage = np.divide(u, t, out=np.zeros_like(u), where=some)
        peak = float((h[some] / t[some]).max()) if some.any() else 0.0
        return {"peak_kv_usage": peak, "mean_kv_usage": float(usage.mean())}
    return {
        "peak_kv_usage": max((h / t for h, t in zip(held, totals) if t), default=0.0),
        "mean_kv_usage": float(np.mean([u / t if t else 0.0 for u, t in zip(used, totals)])) if len(used) else 0.0,
    }


def summarize_levels(
    requests: Sequence[RequestRecord],
    steps: Sequence[StepRecord],
    slo: Slo,
    num_planned: dict[str, int] | None = None,
    plans: dict[str, LevelSchedule] | None = None,
    class_slos: Mapping[str, Mapping[str, Slo]] | None = None,
    arrivals: Mapping[str, ArrivalSettings] | None = None,
) -> list[LevelSummary]:
    """One summary per (bucket, mode, level, variant), in the order the levels first appear.
    ``num_planned``: bucket name -> its num_requests, the requests each of its levels was to run;
    ``plans``: bucket name -> its steady-state LevelSchedule (plain buckets absent); ``class_slos``:
    bucket name -> mix class -> its own SLO; ``arrivals``: bucket name -> its open-loop arrival settings
    (absent: Poisson)."""
    # grouped by the level's fields as a tuple (equal exactly when the LevelKeys are), read in C
    step_positions, request_positions = by_level(steps), by_level(requests)
    out = []
    for level in dict.fromkeys([*step_positions, *request_positions]):  # steps first: the order the levels ran in
        own_requests = pick(requests, request_positions.get(level, []))
        own_steps = pick(steps, step_positions.get(level, []))
        k = LevelKey(*level)
        planned = None if is_alone(k.variant) else (num_planned or {}).get(k.bucket)  # a class alone: its own
        plan = None if is_alone(k.variant) else (plans or {}).get(k.bucket)
        if plan is not None and plan.per_concurrency:  # a protocol's counts: the level's own
            plan = plan.at(k.value)
            planned = plan.num_requests
        summary = summarize_level(
            k, own_requests, own_steps, slo, planned, plan, (class_slos or {}).get(k.bucket),
            arrival=(arrivals or {}).get(k.bucket),
        )  # fmt: skip
        out.append(summary)
    return out


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
