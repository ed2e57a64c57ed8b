"""One request's latencies and the statistics over many: the metric definitions every summary uses.

The definitions are ``DEFINITIONS`` below (vLLM's benchmark definitions, pinned in
docs/metrics.md); the report prints them. A request is *completed* when it finished with
reason stop or length; latency statistics cover completed requests only.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kvplan.results.records import RequestRecord, StepRecord

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
- TTFO (time to first output) = arrival of the first chunk carrying answer text (content, not
  reasoning) - arrival time, for a stream that carried reasoning text (reasoning_content or
  reasoning deltas); null for one that did not. TTFT keeps its definition (any text).
"""


def completed(r: RequestRecord) -> bool:
    return r.finish_reason in ("stop", "length") and r.num_output_tokens > 0


def ttft_s(r: RequestRecord) -> float | None:
    return r.token_times[0] - r.arrival_time if r.token_times else None


def ttfo_s(r: RequestRecord) -> float | None:
    """Time to first output (see TARGET_DEFINITIONS): None unless the stream carried reasoning."""
    return None if r.first_output_time is None else r.first_output_time - r.arrival_time


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


def itls_s(records: Sequence[RequestRecord]) -> np.ndarray:
    """``itl_s`` of every record, one after another, seconds [sum of gaps]: the same differences
    in the same order, taken by numpy (a long output's thousands of gaps at C speed)."""
    gaps = [np.diff(np.asarray(r.token_times, dtype=np.float64)) for r in records if len(r.token_times) > 1]
    return np.concatenate(gaps) if gaps else np.zeros(0, dtype=np.float64)


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


def latency_stats(values_s: Sequence[float] | np.ndarray) -> LatencyStats | None:
    """Statistics of latencies given in seconds (a sequence or a 1-D array), reported in ms; None
    when there are none."""
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
