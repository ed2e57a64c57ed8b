"""The traffic profile of a request log (``kvplan profile``): lengths, prefix reuse, arrivals, load
over time, turns, requests in flight. Pure functions of a log's requests as columns
(kvplan.profile.table) and of their prefix reuse: from token ids here (``prefix_stats``, the
reference, over a log read whole) or from the stream's distinct blocks (kvplan.profile.blocks).

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.block_manager import hash_block
from kvplan.profile.load import load_over_time
from kvplan.profile.log import LoggedRequest, ParsedLog
from kvplan.profile.table import RequestColumns

LONG_TAIL_RATIO = 4.0  # P99 / P50 above this: a long tail
NUM_TOP_PREFIXES = 5
MAX_BAD_SHOWN = 5
# (carriers' indices, P / block_size) -> an id per carrier of its first P tokens: equal ids, equal tokens
PrefixIds = Callable[[np.ndarray, int], np.ndarray]


@dataclass(frozen=True)
class PrefixStats:
    """Per request (arrival order): prompt tokens in reused full blocks, tokens of its shared prefix
    and the prefix's key (its last block: equal keys, equal prefixes; -1: none); per block position,
    the share of requests reaching it whose block there was reused; the typical shared prefix
    (``typical_prefix``)."""

    reuse: float
    reused_tokens: np.ndarray
    shared_tokens: np.ndarray
    prefix_keys: np.ndarray
    reuse_by_block: np.ndarray
    shared_prefix: dict[str, Any] = field(default_factory=lambda: {"num_tokens": 0, "fraction": 0.0, "num_prefixes": 0})

    def top_prefixes(self, n: int = NUM_TOP_PREFIXES) -> list[dict[str, Any]]:
        """The ``n`` shared prefixes carried by the most requests (ties: the first to arrive first)."""
        held = np.flatnonzero(self.prefix_keys >= 0)
        if not len(held):
            return []
        _, first, counts = np.unique(self.prefix_keys[held], return_index=True, return_counts=True)
        top = np.lexsort((first, -counts))[:n]
        total = len(self.prefix_keys)
        return [
            {
                "num_tokens": int(self.shared_tokens[held[first[k]]]),
                "num_requests": int(counts[k]),
                "share": int(counts[k]) / total,
            }
            for k in top
        ]


def typical_prefix(shared_tokens: np.ndarray, block_size: int, prefix_ids: PrefixIds) -> dict[str, Any]:
    """The one shared prefix a workload's ``shared_prefix`` reproduces: ``num_tokens`` = the length P
    (whole blocks) that covers the most shared tokens, P x (requests sharing at least P tokens), the
    longest of equals; ``fraction`` = the share of all requests sharing at least P;
    ``num_prefixes`` = the distinct P-token prefixes among them (``prefix_ids``; 0 tokens: no
    request shares a full block)."""
    carried = shared_tokens[shared_tokens > 0]
    if not len(carried):
        return {"num_tokens": 0, "fraction": 0.0, "num_prefixes": 0}
    lengths, counts = np.unique(carried, return_counts=True)
    covered = lengths * np.cumsum(counts[::-1])[::-1]  # P x the requests sharing at least P
    num_tokens = int(lengths[len(covered) - 1 - int(np.argmax(covered[::-1]))])
    carriers = np.flatnonzero(shared_tokens >= num_tokens)
    return {
        "num_tokens": num_tokens,
        "fraction": len(carriers) / len(shared_tokens),
        "num_prefixes": len(np.unique(prefix_ids(carriers, num_tokens // block_size))),
    }


@dataclass(frozen=True)
class TrafficProfile:
    """A log's profile: ``data`` is the ``--json`` object; the arrays, per request in arrival order,
    are what the workload writer (kvplan.profile.workload) and the plots read; ``notes`` what the
    numbers leave out, one line each (the CLI warns with them)."""

    data: dict[str, Any]
    arrivals_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix: PrefixStats
    # request indices of each session (one-turn sessions included), when lines carry session ids
    sessions: tuple[tuple[int, ...], ...] = field(default=())
    think_times_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    notes: tuple[str, ...] = ()


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
    """Prefix reuse, shared prefixes and reuse by block position (see the module docstring), from
    every request's token ids: the reference the stream's distinct blocks are tested against."""
    chains = [block_hashes(r.token_ids, block_size) if r.token_ids is not None else [] for r in requests]
    holders: dict[bytes, int] = {}
    for chain in chains:
        for h in set(chain):
            holders[h] = holders.get(h, 0) + 1
    seen: set[bytes] = set()
    reused = np.zeros(len(requests), dtype=np.int64)
    shared = np.zeros(len(requests), dtype=np.int64)
    codes: dict[bytes, int] = {}
    keys = np.full(len(requests), -1, dtype=np.int64)
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
        if num_shared:
            keys[i] = codes.setdefault(chain[num_shared - 1], len(codes))
    total = sum(r.input_tokens for r in requests)
    by_block = np.divide(hits, reach, out=np.zeros(depth), where=reach > 0)
    reuse = float(reused.sum() / total) if total else 0.0

    def prefix_ids(carriers: np.ndarray, depth: int) -> np.ndarray:
        ids: dict[bytes, int] = {}
        return np.asarray([ids.setdefault(chains[i][depth - 1], len(ids)) for i in carriers])

    return PrefixStats(reuse, reused, shared, keys, by_block, typical_prefix(shared, block_size, prefix_ids))


def _sessions(columns: RequestColumns) -> tuple[dict[str, Any] | None, list[np.ndarray]]:
    """The turns summary and each session's request indices (arrival order, sessions in the order
    they start; a session of one turn is a session too, and so is a line without a session id
    beside lines with one)."""
    sessions, n = columns.sessions, len(columns.sessions)
    if (sessions >= 0).any():
        codes = np.where(sessions >= 0, sessions, sessions.max() + 1 + np.arange(n))
        _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
        rank = np.argsort(np.argsort(first))[inverse]  # each session's place in the order they start
        order = np.argsort(rank, kind="stable")
        bounds = np.flatnonzero(np.diff(rank[order])) + 1
        groups = np.split(order, bounds)
        counts = np.diff(np.concatenate(([0], bounds, [n])))
        return {"mean": float(np.mean(counts)), "max": int(counts.max())}, groups
    turns = columns.user_turns[columns.user_turns >= 0]
    starts = int((turns == 1).sum())
    if len(turns) and turns.max() > 1 and starts:
        return {"mean": len(turns) / starts, "max": int(turns.max())}, []
    return None, []


def _think_times(columns: RequestColumns, groups: list[np.ndarray]) -> np.ndarray:
    """Within each session: next arrival - previous finish (or previous arrival, finish unknown), s."""
    if not groups:
        return np.zeros(0)
    order = np.concatenate(groups)
    follows = np.ones(len(order), dtype=bool)
    follows[np.cumsum([len(g) for g in groups])[:-1]] = False  # a session's first turn follows nothing
    follows[0] = False
    prev, this = order[:-1][follows[1:]], order[1:][follows[1:]]
    finish = columns.finish_s[prev]
    before = np.where(np.isnan(finish), columns.arrivals_s[prev], finish)
    return np.maximum(columns.arrivals_s[this] - before, 0.0)


def in_flight(arrivals_s: np.ndarray, finish_s: np.ndarray) -> dict[str, Any] | None:
    """Peak and time-weighted mean requests in flight over those with a known finish (NaN: unknown;
    None: none known)."""
    known = ~np.isnan(finish_s)
    if not known.any():
        return None
    arrive, finish = arrivals_s[known], finish_s[known]
    times = np.concatenate((arrive, finish))
    steps = np.concatenate((np.ones(len(arrive), np.int64), -np.ones(len(finish), np.int64)))
    order = np.lexsort((steps, times))  # a finish at the same instant as an arrival is counted first
    peak = max(0, int(np.cumsum(steps[order]).max()))
    window = float(finish.max() - arrive.min())
    mean = float(np.sum(finish - arrive)) / window if window > 0 else float(peak)
    return {"peak": peak, "mean": mean, "num_requests": int(known.sum())}


def profile_log(log: ParsedLog, block_size: int = 16) -> TrafficProfile:
    """The profile of a log read whole (kvplan.profile.parsed.read_log): prefix reuse from its token
    ids (``prefix_stats``); ``data`` is ``--json``'s object."""
    return build_profile(
        RequestColumns.from_requests(log.requests),
        prefix_stats(log.requests, block_size),
        source=log.source,
        num_bad_lines=len(log.bad_lines),
        bad_lines=[b.describe() for b in log.bad_lines[:MAX_BAD_SHOWN]],
        block_size=block_size,
        log_format=log.log_format,
        num_failed=log.num_failed,
        level=log.level,
        levels=log.levels,
        notes=log.notes,
    )


def build_profile(
    columns: RequestColumns,
    prefix: PrefixStats,
    *,
    source: str,
    num_bad_lines: int,
    bad_lines: list[str],
    block_size: int,
    log_format: str | None = None,
    num_failed: int = 0,
    level: str | None = None,
    levels: tuple[str, ...] = (),
    notes: tuple[str, ...] = (),
) -> TrafficProfile:
    """The profile of requests in arrival order (see the module docstring); ``data`` is ``--json``'s
    object."""
    arrivals, inputs, outputs = columns.arrivals_s, columns.input_tokens, columns.output_tokens
    turns, groups = _sessions(columns)
    flight = in_flight(arrivals, columns.finish_s)
    input_p, output_p = percentiles(inputs), percentiles(outputs)
    codes, first = np.unique(columns.format_codes, return_index=True)
    counts = np.bincount(columns.format_codes.astype(np.int64), minlength=len(columns.formats))
    data: dict[str, Any] = {
        "num_requests": len(arrivals),
        "num_bad_lines": num_bad_lines,
        "input_tokens": input_p,
        "output_tokens": output_p,
        "prefix_reuse": prefix.reuse,
        "arrival": arrival_stats(arrivals),
        "turns": turns,
        "turns_source": None if turns is None else ("session_id" if groups else "messages"),
        "peak_in_flight": flight["peak"] if flight else None,
        "source": source,
        "formats": {columns.formats[c]: int(counts[c]) for c in codes[np.argsort(first)]},
        "log_format": log_format,
        "num_failed_requests": num_failed,
        "level": level,
        "levels": list(levels),
        "block_size": block_size,
        "duration_s": float(arrivals[-1] - arrivals[0]),
        "bad_lines": bad_lines,
        "long_tail": {
            "input": bool(input_p["p99"] > LONG_TAIL_RATIO * input_p["p50"]),
            "output": bool(output_p["p99"] > LONG_TAIL_RATIO * output_p["p50"]),
            "rule": f"p99 / p50 > {LONG_TAIL_RATIO:g}",
        },
        "in_flight": flight,
        "shared_prefix": prefix.shared_prefix,
        "top_prefixes": prefix.top_prefixes(),
        **load_over_time(arrivals),
    }
    sessions = tuple(tuple(int(i) for i in g) for g in groups)  # one-turn sessions too: each is a session
    think = _think_times(columns, groups)
    return TrafficProfile(data, arrivals, inputs, outputs, prefix, sessions, think, notes + mixed_note(data["formats"]))


def mixed_note(formats: dict[str, int]) -> tuple[str, ...]:
    """A note when the JSONL lines are of more than one format (``formats``: requests per format):
    each keeps its own clock (Mooncake's ms from the trace's start, a kvplan run's s from its
    start, an OpenAI log's s or ISO dates since 1970), so their arrivals, duration_s and rates are
    read on one axis that none of them shares."""
    if len(formats) < 2:
        return ()
    counts = ", ".join(f"{name} {n:,}" for name, n in formats.items())
    return (
        f"lines of {len(formats)} formats ({counts}), each timed on its own clock: arrivals, duration_s"
        " and rates mix them; profile one format's lines, or force one with --format",
    )
