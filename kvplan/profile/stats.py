"""The traffic profile of a request log (``kvplan profile``): lengths, prefix reuse, arrivals, turns,
requests in flight. Pure functions of kvplan.profile.log's requests.

Definitions (docs/profile.md):

- lengths: percentiles P50/P90/P95/P99 (numpy's linear interpolation) and the max, tokens.
  ``long_tail``: P99 / P50 > 4 (``LONG_TAIL_RATIO``) of that side's lengths.
- prefix reuse: the fraction of all prompt tokens that lie in full blocks (``block_size`` tokens)
  whose hash was seen in an earlier request, the hash being the engine's own chained block hash
  (engine.block_manager.hash_block, no cache salt) over the token ids, requests in arrival order.
  It is what an unbounded prefix cache would hit (the engine caps a request's hit one token short
  of its prompt, and evicts). A kvplan record carries no token ids: it counts its engine's
  ``num_cached_tokens``. A request's *shared prefix* is its leading full blocks whose hashes occur
  in at least one other request; ``top_prefixes`` groups requests by the last of those blocks.
- arrival: rate = (n - 1) / (last - first) requests/s; CV = std / mean of the inter-arrival gaps
  (numpy, ddof=0); gamma shape = 1 / CV^2, the method-of-moments fit of Gamma gaps (vLLM's
  ``--burstiness``; 1 = Poisson).
- turns: lines per session id when lines carry one (a line without one is a session of 1); else,
  when ``messages`` show history, lines / lines holding one user message (each such line starts a
  conversation) and the max user messages of a line; else null.
- in flight: over the requests whose finish time is known (kvplan's ``finish_time``; ``timestamp``
  + ``latency_s`` or ``e2e_ms``): the peak count of [arrival, finish) intervals that overlap, and
  the time-weighted mean, sum(finish - arrival) / (last finish - first arrival); null without one.
- ``log_format``: the file's format, as its CSV header or first line tells it (kvplan.profile.csv_traces;
  null for a log read by kvplan.profile.log.read_log alone); ``num_failed_requests``: failed rows left
  out (a BurstGPT row with 0 response tokens), not requests and not bad lines.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.block_manager import hash_block
from kvplan.profile.log import LoggedRequest, ParsedLog

LONG_TAIL_RATIO = 4.0  # P99 / P50 above this: a long tail
NUM_TOP_PREFIXES = 5
MAX_BAD_SHOWN = 5


@dataclass(frozen=True)
class PrefixStats:
    """Per request (arrival order): prompt tokens in reused full blocks, tokens of its shared prefix
    and the prefix's key (None: none); per block position, the share of requests reaching it whose
    block there was reused."""

    reuse: float
    reused_tokens: np.ndarray
    shared_tokens: np.ndarray
    prefix_keys: tuple[bytes | None, ...]
    reuse_by_block: np.ndarray
    chains: tuple[tuple[bytes, ...], ...] = ()

    def typical_prefix(self, block_size: int) -> dict[str, Any]:
        """The one shared prefix a workload's ``shared_prefix`` reproduces: ``num_tokens`` = the
        length P (whole blocks) that covers the most shared tokens, P x (requests sharing at least P
        tokens), the longest of equals; ``fraction`` = the share of all requests sharing at least P;
        ``num_prefixes`` = the distinct P-token prefixes among them (0 tokens: no request shares a
        full block)."""
        carried = self.shared_tokens[self.shared_tokens > 0]
        if not len(carried):
            return {"num_tokens": 0, "fraction": 0.0, "num_prefixes": 0}
        lengths = np.unique(carried)
        covered = [int(p) * int((carried >= p).sum()) for p in lengths]
        num_tokens = int(lengths[len(covered) - 1 - int(np.argmax(covered[::-1]))])
        depth = num_tokens // block_size
        carriers = [i for i, n in enumerate(self.shared_tokens) if n >= num_tokens]
        distinct = {self.chains[i][depth - 1] for i in carriers}
        return {
            "num_tokens": num_tokens,
            "fraction": len(carriers) / len(self.shared_tokens),
            "num_prefixes": len(distinct),
        }


@dataclass(frozen=True)
class TrafficProfile:
    """A log's profile: ``data`` is the ``--json`` object; the arrays, per request in arrival order,
    are what the workload writer (kvplan.profile.workload) and the plots read."""

    data: dict[str, Any]
    arrivals_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix: PrefixStats
    # request indices of each session (one-turn sessions included), when lines carry session ids
    sessions: tuple[tuple[int, ...], ...] = field(default=())
    think_times_s: np.ndarray = field(default_factory=lambda: np.zeros(0))


def percentiles(values: np.ndarray) -> dict[str, float]:
    """P50, P90, P95, P99 (numpy's default linear interpolation) and the max."""
    if len(values) == 0:
        return {"p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    p50, p90, p95, p99 = np.percentile(values, [50, 90, 95, 99])
    return {"p50": float(p50), "p90": float(p90), "p95": float(p95), "p99": float(p99), "max": float(values.max())}


def arrival_stats(arrivals_s: np.ndarray) -> dict[str, float | None]:
    """Rate (n - 1) / (last - first) req/s, the gaps' CV (ddof=0; below 1e-9, float rounding of evenly
    spaced timestamps, it is 0) and the gamma shape 1 / CV^2 (None at CV 0)."""
    span = float(arrivals_s[-1] - arrivals_s[0]) if len(arrivals_s) > 1 else 0.0
    gaps = np.diff(arrivals_s)
    mean = float(gaps.mean()) if len(gaps) else 0.0
    cv = float(gaps.std() / mean) if mean > 0 else None
    if cv is not None and cv < 1e-9:  # evenly spaced: float rounding of the timestamps, not burstiness
        cv = 0.0
    return {
        "rate_per_s": (len(arrivals_s) - 1) / span if span > 0 else None,
        "cv": cv,
        "gamma_shape": 1.0 / cv**2 if cv else None,
    }


def block_hashes(token_ids: tuple[int, ...], block_size: int) -> list[bytes]:
    """The engine's chained hashes (engine.block_manager.hash_block, no salt) of the full blocks."""
    hashes: list[bytes] = []
    for i in range(len(token_ids) // block_size):
        hashes.append(
            hash_block(hashes[-1] if hashes else None, token_ids[i * block_size : (i + 1) * block_size], None)
        )
    return hashes


def prefix_stats(requests: Sequence[LoggedRequest], block_size: int) -> PrefixStats:
    """Prefix reuse, shared prefixes and reuse by block position (see the module docstring)."""
    chains = [block_hashes(r.token_ids, block_size) if r.token_ids is not None else [] for r in requests]
    holders = Counter(h for chain in chains for h in set(chain))
    seen: set[bytes] = set()
    reused = np.zeros(len(requests), dtype=np.int64)
    shared = np.zeros(len(requests), dtype=np.int64)
    keys: list[bytes | None] = []
    depth = max((len(c) for c in chains), default=0)
    hits, reach = np.zeros(depth), np.zeros(depth)
    for i, (request, chain) in enumerate(zip(requests, chains)):
        if request.token_ids is None and request.cached_tokens is not None:
            reused[i] = min(request.cached_tokens, request.input_tokens)
        was_seen = [h in seen for h in chain]
        reused[i] += block_size * sum(was_seen)
        reach[: len(chain)] += 1
        hits[: len(chain)] += was_seen
        seen.update(chain)
        num_shared = next((k for k, h in enumerate(chain) if holders[h] < 2), len(chain))
        shared[i] = num_shared * block_size
        keys.append(chain[num_shared - 1] if num_shared else None)
    total = sum(r.input_tokens for r in requests)
    by_block = np.divide(hits, reach, out=np.zeros(depth), where=reach > 0)
    reuse = float(reused.sum() / total) if total else 0.0
    return PrefixStats(reuse, reused, shared, tuple(keys), by_block, tuple(tuple(c) for c in chains))


def _sessions(requests: Sequence[LoggedRequest]) -> tuple[dict[str, Any] | None, list[list[int]]]:
    """The turns summary and each session's request indices (arrival order; a session of one turn
    is a session too, and so is a line without a session id beside lines with one)."""
    if any(r.session is not None for r in requests):
        groups: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            groups[r.session if r.session is not None else f"\0line{r.line}"].append(i)
        counts = [len(g) for g in groups.values()]
        return {"mean": float(np.mean(counts)), "max": max(counts)}, list(groups.values())
    user_turns = [r.user_turns for r in requests if r.user_turns is not None]
    starts = sum(1 for t in user_turns if t == 1)
    if user_turns and max(user_turns) > 1 and starts:
        return {"mean": len(user_turns) / starts, "max": max(user_turns)}, []
    return None, []


def _think_times(requests: Sequence[LoggedRequest], groups: list[list[int]]) -> np.ndarray:
    """Within each session: next arrival - previous finish (or previous arrival, finish unknown), s."""
    gaps = []
    for group in groups:
        for a, b in zip(group, group[1:]):
            finish = requests[a].finish_s
            before = finish if finish is not None else requests[a].arrival_s
            gaps.append(max(requests[b].arrival_s - before, 0.0))
    return np.asarray(gaps, dtype=float)


def in_flight(requests: Sequence[LoggedRequest]) -> dict[str, Any] | None:
    """Peak and time-weighted mean requests in flight over those with a known finish (None: none)."""
    spans = [(r.arrival_s, float(r.finish_s)) for r in requests if r.finish_s is not None]
    if not spans:
        return None
    events = sorted([(a, 1) for a, _ in spans] + [(f, -1) for _, f in spans], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in events:  # a finish at the same instant as an arrival is counted first
        now += step
        peak = max(peak, now)
    window = max(f for _, f in spans) - min(a for a, _ in spans)
    mean = sum(f - a for a, f in spans) / window if window > 0 else float(peak)
    return {"peak": peak, "mean": mean, "num_requests": len(spans)}


def profile_log(log: ParsedLog, block_size: int = 16) -> TrafficProfile:
    """The profile of a parsed log (see the module docstring); ``data`` is ``--json``'s object."""
    requests = log.requests
    arrivals = np.asarray([r.arrival_s for r in requests], dtype=float)
    inputs = np.asarray([r.input_tokens for r in requests], dtype=np.int64)
    outputs = np.asarray([r.output_tokens for r in requests], dtype=np.int64)
    prefix = prefix_stats(requests, block_size)
    turns, groups = _sessions(requests)
    flight = in_flight(requests)
    input_p, output_p = percentiles(inputs), percentiles(outputs)
    key_counts = Counter(k for k in prefix.prefix_keys if k is not None)
    length_of = {k: int(s) for k, s in zip(prefix.prefix_keys, prefix.shared_tokens) if k is not None}
    data: dict[str, Any] = {
        "num_requests": len(requests),
        "num_bad_lines": len(log.bad_lines),
        "input_tokens": input_p,
        "output_tokens": output_p,
        "prefix_reuse": prefix.reuse,
        "arrival": arrival_stats(arrivals),
        "turns": turns,
        "turns_source": None if turns is None else ("session_id" if groups else "messages"),
        "peak_in_flight": flight["peak"] if flight else None,
        "source": log.source,
        "formats": dict(Counter(r.fmt for r in requests)),
        "log_format": log.log_format,
        "num_failed_requests": log.num_failed,
        "level": log.level,
        "levels": list(log.levels),
        "block_size": block_size,
        "duration_s": float(arrivals[-1] - arrivals[0]),
        "bad_lines": [b.describe() for b in log.bad_lines[:MAX_BAD_SHOWN]],
        "long_tail": {
            "input": bool(input_p["p99"] > LONG_TAIL_RATIO * input_p["p50"]),
            "output": bool(output_p["p99"] > LONG_TAIL_RATIO * output_p["p50"]),
            "rule": f"p99 / p50 > {LONG_TAIL_RATIO:g}",
        },
        "in_flight": flight,
        "shared_prefix": prefix.typical_prefix(block_size),
        "top_prefixes": [
            {"num_tokens": length_of[k], "num_requests": n, "share": n / len(requests)}
            for k, n in key_counts.most_common(NUM_TOP_PREFIXES)
        ],
    }
    sessions = tuple(tuple(g) for g in groups)  # one-turn sessions too: each is a session, its turn a request
    return TrafficProfile(data, arrivals, inputs, outputs, prefix, sessions, _think_times(requests, groups))
