"""The machine-readable summary of a run: what ``kvplan report RUN --json`` prints.

One object per run, the same shape for every kind of run (measured, simulated, a remote target),
for scripts and CI. Keys are a contract: fields may be added, never renamed::

    {"source": "measured", "workload": "chat", "status": "complete",
     "buckets": [{"name", "knee", "slo_max_concurrency", "slo_max_request_rate",
                  "levels": [{"mode", "level", "num_completed", "num_failed", "preemptions",
                              "peak_used_blocks", "output_throughput_tok_s", "goodput_req_s",
                              "ttft_ms": {"mean", "p50", "p95", "p99"}, "tpot_ms", "itl_ms", "e2e_ms"}]}]}

``knee``: the lowest closed-loop concurrency that preempted (null: none did): in a simulation that
searched every concurrency (kvplan.results.simulated), the exact one; otherwise the lowest level
of the run that preempted. ``slo_max_concurrency`` / ``slo_max_request_rate``: the highest
concurrency and request rate at which the SLO attainment target was met, null in a run that did
not search for them. Added since: per bucket ``measured_knee``, ``simulated_knee``,
``predicted_max_concurrency`` and ``slo_capacity`` (knee, attainment target, and at each maximum
its level, attainment, output tok/s and goodput, ``above_concurrency`` / ``above_request_rate``:
the lowest level searched that failed above each maximum, ``concurrency_bound``
(``max_num_seqs`` when the SLO still held at the scheduler's limit), ``request_rate_bound``
(``saturation``: it held at the rate that limit serves), and ``burst_meets_slo``: the SLO holds
at the scheduler's limit and bounds TPOT only, so no rate is too high and ``slo_max_request_rate``
is null);
per run ``targets``, the same answers for every target a simulation searched (the engine, and
each ``plan:`` entry it could time), each naming what timed its steps in ``step_times``
(``silicon: h100_sxm / vllm 0.24.0``, ``roofline``, ``calibrated``, ``replay``; null in older runs),
and for a GPU target its ``weight_dtype`` (as given; ``auto``: the checkpoint's own), ``ep`` and
``backend`` (null, and ep 1, for the engine section).

A run against a remote server (``source: target``) fills ``server`` (``url``, ``model``,
``metrics_available``, ``num_gpu_blocks``, ``block_size``) and per level ``server_preemptions``
and ``server_peak_kv_usage`` (0..1), each null where the server does not expose it, never 0;
its ``preemptions`` are the server's and its ``peak_used_blocks`` null (no engine steps). Added
since: ``server`` also gives ``pool_tokens``, ``pool_source`` (the /metrics name or llama.cpp's
``/props``), ``num_slots`` and ``slot_ctx_tokens`` (llama.cpp), ``kv_usage_metric`` (the name the
KV usage was read from) and ``kv_usage_note`` (null, or what that gauge measures when it is not
KV usage: SGLang's ``token_usage`` on a hybrid model); per level ``server_mean_kv_usage``,
``server_output_tokens`` (the server's generated-token counter across the level),
``server_prefix_hit_rate`` (its prefix-cache hit tokens over queried prompt tokens, 0..1), ``ttfo_ms``
(time to first output, the first answer chunk, for streams that carried reasoning; null
otherwise) and ``client`` (a target level's client cost: ``lag_p99_ms``, ``stamp_delay_p99_ms``,
``ttft_p50_ms``, ``send_delay_p99_ms``, ``mean_interarrival_ms``, ``cpu_s``, ``wall_s``,
``behind``, ``behind_reason``, ``workers``; null in-process). Every
run also gives per level ``num_errors``, ``error_reasons``, ``requested_rate`` and
``achieved_rate`` (open loop, requests/s; sessions/s in a session level), ``slo_attainment`` (0..1), and admission's
``num_rejected``, ``shed_fraction``, ``rejected_reasons`` and ``tenants`` (per tenant ``name``,
``num_requests``, ``num_rejected``, ``shed_fraction``, ``num_completed``, ``ttft_ms``).
``server`` is null for an in-process run. A
steady-state level (warm-up, cool-down, ``duration_s``) gives ``num_measured`` (the requests
every statistic covers), ``num_excluded`` (warm-up and cool-down requests left out) and
``window_start_s`` / ``window_end_s``: the measured window, seconds from the level's first
arrival (null for a plain level: all its requests are measured). An open-loop level gives
``arrival_process`` (poisson, gamma, constant), ``requested_cv`` (the inter-arrival coefficient of
variation it asks for: 1, 1/sqrt(burstiness), 0) and ``achieved_cv`` (std / mean of the gaps
between its requests' sorted arrival times, numpy's ddof=0; null under 3 requests); all three are
null for a closed-loop level (kvplan.results.stats.arrival_stats). A level of multi-turn sessions
(``dataset.sessions``) gives ``turns``: per turn ``turn`` (1-based), ``num_completed``, ``ttft_ms``,
``prefix_hit_tokens`` (its requests' prompt tokens served by the prefix cache) and
``prompt_tokens``; null for other levels (kvplan.results.stats.turns). A level of a ``mix`` bucket gives
``classes``: per request class ``name``, ``num_requests``, ``num_completed``, ``ttft_ms``,
``tpot_ms``, ``itl_ms``, ``e2e_ms``, ``slo_attainment`` (against the class's own SLO) and
``goodput_req_s`` ([] for other levels; kvplan.results.stats.classes); a class run alone at its share of
the load (interference) is a level of its own, variant ``alone:<class>`` (``<variant>
alone:<class>`` on an engine variant), and each mixed level gives ``interference``: per class
``name``, ``ttft_p99_ms_mixed``, ``ttft_p99_ms_alone``, ``tpot_p99_ms_mixed``,
``tpot_p99_ms_alone`` ([] where no class ran alone; kvplan.results.stats.interference). Engine variants
(``variants:``) are levels of their own too, ``variant`` naming each.
"""

from __future__ import annotations

from typing import Any

from kvplan.results.metrics import LatencyStats, LevelSummary, preemptions
from kvplan.results.run_result import RunResult
from kvplan.results.simulated import BucketCapacity, SloPoint
from kvplan.results.stats.interference import ClassInterference, interference

_STATS = ("mean", "p50", "p95", "p99")


def _stats(stats: LatencyStats | None) -> dict[str, float | None]:
    return {key: None if stats is None else getattr(stats, key) for key in _STATS}


def level_json(level: LevelSummary) -> dict[str, Any]:
    """One level of the summary (see the module docstring)."""
    stepped = level.num_steps > 0
    return {
        "mode": level.mode,
        "level": level.level,
        "variant": level.variant,
        "num_completed": level.num_completed,
        "num_failed": level.num_failed,
        "preemptions": preemptions(level),
        "peak_used_blocks": level.peak_used_blocks if stepped else None,
        "output_throughput_tok_s": level.output_tokens_per_s,
        "goodput_req_s": level.goodput_rps,
        "ttft_ms": _stats(level.ttft_ms),
        "tpot_ms": _stats(level.tpot_ms),
        "itl_ms": _stats(level.itl_ms),
        "e2e_ms": _stats(level.e2e_ms),
        "server_preemptions": level.server_preemptions,
        "server_peak_kv_usage": level.server_peak_kv_usage,
        "server_mean_kv_usage": level.server_mean_kv_usage,
        "server_output_tokens": level.server_output_tokens,
        "server_prefix_hit_rate": level.server_prefix_hit_rate,
        "ttfo_ms": _stats(level.ttfo_ms) if level.ttfo_ms is not None else None,
        "num_errors": level.num_errors,
        "error_reasons": dict(level.error_reasons),
        "slo_attainment": level.slo_attainment,
        "num_rejected": level.num_rejected,
        "shed_fraction": level.shed_fraction,
        "rejected_reasons": dict(level.rejected_reasons),
        "tenants": [
            {
                "name": t.name,
                "num_requests": t.num_requests,
                "num_rejected": t.num_rejected,
                "shed_fraction": t.shed_fraction,
                "num_completed": t.num_completed,
                "ttft_ms": _stats(t.ttft_ms),
            }
            for t in level.tenants
        ],
        "requested_rate": level.requested_rate,
        "achieved_rate": level.achieved_rate,
        "num_measured": level.num_requests,
        "num_excluded": level.num_excluded,
        "window_start_s": level.window_start_s,
        "window_end_s": level.window_end_s,
        "arrival_process": level.arrival_process,
        "requested_cv": level.requested_cv,
        "achieved_cv": level.achieved_cv,
        "turns": _turns(level),
        "classes": [
            {
                "name": c.name,
                "num_requests": c.num_requests,
                "num_completed": c.num_completed,
                "ttft_ms": _stats(c.ttft_ms),
                "tpot_ms": _stats(c.tpot_ms),
                "itl_ms": _stats(c.itl_ms),
                "e2e_ms": _stats(c.e2e_ms),
                "slo_attainment": c.slo_attainment,
                "goodput_req_s": c.goodput_rps,
            }
            for c in level.classes
        ],
    }


def _turns(level: LevelSummary) -> list[dict[str, Any]] | None:
    """A session level's per-turn statistics (kvplan.results.stats.turns); None for other levels."""
    if level.turns is None:
        return None
    keys = ("turn", "num_completed", "prefix_hit_tokens", "prompt_tokens")
    return [{**{k: getattr(t, k) for k in keys}, "ttft_ms": _stats(t.ttft_ms)} for t in level.turns]


def _interference(level: LevelSummary, rows: list[ClassInterference]) -> list[dict[str, Any]]:
    """A mixed level's classes, P99 mixed against alone (kvplan.results.stats.interference)."""
    keys = ("ttft_p99_ms_mixed", "ttft_p99_ms_alone", "tpot_p99_ms_mixed", "tpot_p99_ms_alone")
    return [
        {"name": r.request_class, **{k: getattr(r, k) for k in keys}}
        for r in rows
        if (r.bucket, r.mode, r.level, r.variant) == (level.bucket, level.mode, level.level, level.variant)
    ]


_CLIENT = (
    "workers",
    "lag_p99_ms",
    "lag_max_ms",
    "stamp_delay_p99_ms",
    "ttft_p50_ms",
    "send_delay_p99_ms",
    "mean_interarrival_ms",
    "cpu_s",
    "wall_s",
    "behind",
    "behind_reason",
)


def _client(result: RunResult, level: LevelSummary) -> dict[str, Any] | None:
    """A target level's client cost (kvplan.results.target_facts.ClientLevel); None in-process."""
    key = (level.bucket, level.mode, level.level, level.variant)
    own = next((c for c in result.client if (c.bucket, c.mode, c.level, c.variant) == key), None)
    return None if own is None else {k: getattr(own, k) for k in _CLIENT}


def _point(point: SloPoint | None) -> dict[str, Any] | None:
    if point is None:
        return None
    return {
        "level": point.level,
        "slo_attainment": point.slo_attainment,
        "output_throughput_tok_s": point.output_tokens_per_s,
        "goodput_req_s": point.goodput_rps,
    }


def capacity_json(bucket: BucketCapacity | None, attainment: float | None) -> dict[str, Any]:
    """A bucket's searched answers: knee, and the SLO maxima with throughput and goodput there."""
    if bucket is None:
        return {
            "knee": None,
            "attainment_target": attainment,
            "max_concurrency": None,
            "max_request_rate": None,
            "burst_meets_slo": None,
            "concurrency_bound": None,
            "request_rate_bound": None,
            "above_concurrency": None,
            "above_request_rate": None,
        }
    return {
        "knee": bucket.knee,
        "attainment_target": attainment,
        "max_concurrency": _point(bucket.max_concurrency),
        "max_request_rate": _point(bucket.max_request_rate),
        "burst_meets_slo": bucket.burst_meets_slo,
        "concurrency_bound": bucket.concurrency_bound,
        "request_rate_bound": bucket.request_rate_bound,
        "above_concurrency": _point(bucket.above_concurrency),
        "above_request_rate": _point(bucket.above_request_rate),
    }


def summary_json(result: RunResult) -> dict[str, Any]:
    """The run's summary as plain JSON types (see the module docstring)."""
    engine = next((t for t in result.capacity if t.target == "engine"), None)
    mixed = interference(result.levels)
    buckets = []
    for bucket in result.buckets:
        searched = engine.bucket(bucket.name) if engine else None
        top = lambda point: None if point is None else point.level  # noqa: E731
        buckets.append(
            {
                "name": bucket.name,
                "knee": searched.knee if searched else bucket.measured_knee,
                "slo_max_concurrency": top(searched.max_concurrency) if searched else None,
                "slo_max_request_rate": top(searched.max_request_rate) if searched else None,
                "levels": [
                    {**level_json(lv), "interference": _interference(lv, mixed), "client": _client(result, lv)}
                    for lv in result.levels
                    if lv.bucket == bucket.name
                ],
                "measured_knee": bucket.measured_knee,
                "simulated_knee": bucket.simulated_knee,
                "predicted_max_concurrency": bucket.predicted_max_concurrency,
                "slo_capacity": capacity_json(searched, engine.attainment_target if engine else None),
            }
        )
    return {
        "source": result.source,
        "workload": result.workload.name,
        "status": result.status,
        "server": None
        if result.server is None
        else {
            key: getattr(result.server, key)
            for key in (
                "url",
                "model",
                "metrics_available",
                "num_gpu_blocks",
                "block_size",
                "pool_tokens",
                "pool_source",
                "num_slots",
                "slot_ctx_tokens",
                "kv_usage_metric",
                "kv_usage_note",
            )
        },
        "buckets": buckets,
        "targets": [
            {
                "target": t.target,
                "model": t.model,
                "gpu": t.gpu,
                "tp": t.tp,
                "kv_cache_dtype": t.kv_cache_dtype,
                "step_times": t.step_times or None,
                "weight_dtype": t.weight_dtype,
                "ep": t.ep,
                "dp": t.dp,
                "backend": t.backend,
                "disagg": t.disagg,
                "buckets": [{"name": b.name, **capacity_json(b, t.attainment_target)} for b in t.buckets],
            }
            for t in result.capacity
        ],
    }
