"""The tables of a target run's report that stand in for the engine's: kvplan's estimate of the KV
pool beside the server's, and the knee as far as the server lets it be seen. A value the server
does not expose reads ``unavailable``, a missing estimate says why, never 0 or an empty cell
(kvplan.results.report.tables hands a target run's tables to these)."""

from __future__ import annotations

import pandas as pd

from kvplan.results.metrics import preemptions
from kvplan.results.run_result import RunResult

NA = "unavailable"
NO_ESTIMATE = "no estimate (give --model)"
NO_POOL = "no estimate (no server pool to size)"
MIB = 2**20


def _or_na(value: float | None) -> float | str:
    return NA if value is None else value


def pool_table(result: RunResult) -> pd.DataFrame:
    """kvplan's estimate of the KV pool beside the server's (its /metrics, or llama.cpp's /props)."""
    est, s = result.estimate, result.server
    assert s is not None  # a target run's
    missing = _no_estimate(result)

    def ours(value):
        return missing if est is None else value

    slots = f"{s.num_slots} x {s.slot_ctx_tokens:,} tokens" if s.num_slots and s.slot_ctx_tokens else None
    rows = [
        ("KV bytes per token", ours(est and est.bytes_per_token), "not exposed"),
        ("KV pool tokens", ours(est and est.pool_tokens), _or_na(s.pool_tokens)),
        ("KV pool blocks", ours(est and est.num_blocks), _or_na(s.num_gpu_blocks) if not slots else "-"),
        ("block size (tokens)", ours(est and est.block_size), _or_na(s.block_size) if not slots else "-"),
        ("slots x context (llama.cpp)", "-", slots or "-"),
        ("KV pool MiB", ours(est and est.pool_bytes / MIB), "not exposed"),
        ("KV dtype", ours(est and est.kv_cache_dtype), s.cache_dtype or NA),
        ("pool read from", "-", s.pool_source or NA),
    ]
    return pd.DataFrame(rows, columns=["quantity", "estimated (kvplan)", "server"])


def _no_estimate(result: RunResult) -> str:
    """Why a target run has no estimate: no --model, or no pool the server exposes to size."""
    target = result.workload.config.get("target") or {}
    return NO_POOL if isinstance(target, dict) and target.get("estimate_model") else NO_ESTIMATE


def knee_table(result: RunResult) -> pd.DataFrame:
    """Per bucket: kvplan's P95 bound and the knee of the levels run, as far as the server lets it
    be seen: ``unavailable`` where it exposes no preemption counter, ``none up to c=N`` where it
    does and no level preempted."""
    rows, missing = [], _no_estimate(result)
    for b in result.buckets:
        closed = [lv for lv in result.levels if lv.bucket == b.name and lv.mode == "closed"]
        seen = [lv for lv in closed if preemptions(lv) is not None]
        top = max((int(lv.level) for lv in seen), default=None)
        knee: int | str
        clean: int | str
        if not seen:
            knee = clean = f"{NA} (no preemption counter)"
        else:
            knee = b.measured_knee if b.measured_knee is not None else f"none up to c={top}"
            clean = b.max_clean_concurrency if b.max_clean_concurrency is not None else "none"
        rows.append(
            {
                "bucket": b.name,
                "P95 request tokens": missing if b.p95_request_tokens is None else b.p95_request_tokens,
                "predicted max concurrency": (
                    missing if b.predicted_max_concurrency is None else b.predicted_max_concurrency
                ),
                "knee of the target levels": knee,
                "highest level without preemption": clean,
            }
        )
    return pd.DataFrame(rows)


def target_knee_note(result: RunResult) -> str:
    """The knee table's note for a target run ("" for an in-process one)."""
    if result.server is None:
        return ""
    return (
        "Predicted: how many requests of the bucket's P95 length (prompt + output tokens) fit the server's"
        " pool at once (kvplan's bytes per token for --model; llama.cpp: at most one per slot). Knee of the"
        " target levels: the lowest concurrency at which the server's preemption counter rose; unavailable"
        " where the server exposes none (transformers serve, llama.cpp, SGLang before retractions were counted)."
    )
