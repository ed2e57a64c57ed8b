"""A Mooncake-format request trace (``dataset: {kind: trace, path: FILE}``): read and checked against the workload.

The format is that of the FAST'25 Mooncake traces (github.com/kvcache-ai/Mooncake,
``FAST25-release/traces/conversation_trace.jsonl``; its README's samples), which AIPerf replays
too (``--custom-dataset-type mooncake_trace``, ai-dynamo/aiperf docs/benchmark_modes/trace_replay.md),
as NVIDIA Dynamo's benchmarks/data_generator reads it: JSONL, one request a line::

    {"timestamp": 3000, "input_length": 6324, "output_length": 548, "hash_ids": [0, 415, 416, ...]}

- ``timestamp``: the arrival, ms from the trace's start (non-decreasing down the file);
- ``input_length``, ``output_length``: the prompt's and the reply's length, tokens;
- ``hash_ids``: one id per ``block_tokens``-token block of the prompt (512 in Mooncake's traces,
  AIPerf's ``--isl-block-size`` default), ``ceil(input_length / block_tokens)`` of them; two
  requests with the same id at the same place share that block's tokens, so a common leading run
  of ids is a common prompt prefix.

Replayed here: hash id ``h`` expands to ``block_tokens`` token ids drawn uniformly from
[0, vocab_size) by ``numpy.random.default_rng([seed, 0, h])`` (the workload's seed), the prompt is
its blocks' ids concatenated and cut to ``input_length`` (the last block partial; a line without
``hash_ids`` draws blocks of its own, ``[seed, 1, line, block]``, shared with nothing), and
``max_tokens`` = ``output_length``; ``max_input_tokens`` / ``max_output_tokens`` clip them (the
first tokens are kept, so leading shared blocks stay shared). A bucket over a trace runs one
open-loop level whose request i arrives ``timestamp_i / 1000 / speed`` s after the level starts,
each line once; the level's value (its LevelKey) is the trace's mean request rate after ``speed``,
``(n - 1) / (last offset - first offset)`` req/s.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.workload.schema import MAX_LEVEL_S, Workload

# bucket keys a trace replaces: lengths and counts come from its lines, arrival times from its timestamps
_REPLACED = ("input_tokens", "output_tokens", "mix", "num_requests", "concurrency", "request_rates", "arrival")
_ONE_PASS = ("duration_s", "warmup", "cooldown")  # a trace level sends each line once


@dataclass(frozen=True)
class TraceRequest:
    """One line of a trace: its number in the file (1-based), arrival offset after ``speed``, s,
    lengths, tokens, and block hash ids (None: the line gave none)."""

    line: int
    offset_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None


@dataclass(frozen=True)
class Trace:
    """The first ``max_requests`` requests of a trace file, in file order."""

    requests: tuple[TraceRequest, ...]

    @property
    def offsets(self) -> tuple[float, ...]:
        """Each request's arrival, s from the level's start."""
        return tuple(r.offset_s for r in self.requests)

    @property
    def mean_rate(self) -> float:
        """The mean request rate, req/s: (n - 1) gaps over the span from first to last arrival."""
        span = self.requests[-1].offset_s - self.requests[0].offset_s
        return (len(self.requests) - 1) / span


def _int_field(row: dict, name: str, line: str, where: str) -> int:
    value = row.get(name)
    if value is None:
        raise KvplanError(f"{line}: {name}", "required field missing", source=where)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KvplanError(f"{line}: {name}", f"must be an integer >= 1, tokens (got {value!r})", source=where)
    return value


def _request(row: object, number: int, speed: float, block_tokens: int, where: str) -> TraceRequest:
    line = f"line {number}"
    if not isinstance(row, dict):
        raise KvplanError(line, "each line must be a JSON object", source=where)
    stamp = row.get("timestamp")
    if stamp is None:
        raise KvplanError(f"{line}: timestamp", "required field missing", "give the arrival in ms", source=where)
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp) or stamp < 0:
        raise KvplanError(f"{line}: timestamp", f"must be a number of ms >= 0 (got {stamp!r})", source=where)
    inputs = _int_field(row, "input_length", line, where)
    outputs = _int_field(row, "output_length", line, where)
    ids = row.get("hash_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids):
            raise KvplanError(f"{line}: hash_ids", "must be a list of integers >= 0", source=where)
        needed = -(-inputs // block_tokens)
        if len(ids) < needed:
            raise KvplanError(
                f"{line}: hash_ids",
                f"{len(ids)} ids cover {len(ids) * block_tokens} tokens, input_length {inputs} needs {needed}"
                f" blocks of {block_tokens}",
                "give one id per block, or set dataset.block_tokens to the trace's block size",
                source=where,
            )
    return TraceRequest(number, stamp / 1000.0 / speed, inputs, outputs, None if ids is None else tuple(ids))


@lru_cache(maxsize=8)
def _read(path: str, size: int, mtime_ns: int, speed: float, max_requests: int | None, block_tokens: int) -> Trace:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # an editor's or spreadsheet's byte-order mark
    except (OSError, UnicodeDecodeError) as err:
        raise KvplanError("", f"cannot read the trace ({err})", source=path) from None
    requests: list[TraceRequest] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if max_requests is not None and len(requests) >= max_requests:
            break
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as err:
            raise KvplanError(f"line {number}", f"not valid JSON ({err.msg})", source=path) from None
        request = _request(row, number, speed, block_tokens, path)
        if requests and request.offset_s < requests[-1].offset_s:
            raise KvplanError(
                f"line {number}: timestamp",
                f"{row['timestamp']} ms is before line {requests[-1].line}'s",
                "sort the trace by timestamp",
                source=path,
            )
        requests.append(request)
    if not requests:
        raise KvplanError("", "the trace has no requests (no non-blank lines)", source=path)
    return Trace(tuple(requests))


def read_trace(workload: Workload) -> Trace | None:
    """The workload's trace (None unless ``dataset.kind`` is trace), read once per file version.

    Raises:
        KvplanError: an unreadable or empty file, a line that is not a JSON object, a missing or
            bad field (naming the line and the field), timestamps out of order.
    """
    dataset, path = workload.dataset, workload.dataset_path
    if dataset.kind != "trace" or path is None:
        return None
    stat = path.stat()
    return _read(str(path), stat.st_size, stat.st_mtime_ns, dataset.speed, dataset.max_requests, dataset.block_tokens)


def check_trace(workload: Workload) -> None:
    """The rules a trace sets across sections (kvplan.workload.file runs them): buckets that
    take everything from the trace, no sessions or shared prefix, arrivals within a level's 24 h,
    and a request rate (arrivals not all at once).

    Raises:
        KvplanError: naming the field, or the trace's line.
    """
    trace = read_trace(workload)
    if trace is None:
        return
    where = workload.source
    if workload.dataset.sessions is not None:
        raise KvplanError("dataset.sessions", "does not apply to a trace", "drop sessions", source=where)
    if workload.shared_prefix is not None:
        raise KvplanError(
            "shared_prefix", "does not apply to a trace: its hash_ids give the shared prefixes", source=where
        )
    for i, bucket in enumerate(workload.buckets):
        for key in (*_REPLACED, *_ONE_PASS):
            if key in bucket.model_fields_set:
                what = "its lengths, counts and arrival times" if key in _REPLACED else "one pass over its lines"
                raise KvplanError(
                    f"buckets[{i}].{key}",
                    f"does not apply to a trace bucket (the trace gives {what})",
                    f"drop {key}" + ("; dataset.max_requests takes the first lines" if key == "num_requests" else ""),
                    source=where,
                )
    last = trace.requests[-1]
    if len(trace.requests) < 2 or last.offset_s == trace.requests[0].offset_s:
        raise KvplanError(
            "dataset.path",
            f"all {len(trace.requests)} requests of the trace arrive at once, so it has no request rate",
            "give a trace (or max_requests) spanning more than one timestamp",
            source=where,
        )
    if last.offset_s > MAX_LEVEL_S:
        raise KvplanError(
            "dataset.speed",
            f"line {last.line} arrives {last.offset_s:.3g} s in, over the {MAX_LEVEL_S // 3600} h a level may last",
            "raise speed or lower max_requests",
            source=where,
        )
    max_len = workload.engine.max_model_len
    if max_len is not None:
        for r in trace.requests:
            total = clipped(r.input_length, workload.dataset.max_input_tokens)
            total += clipped(r.output_length, workload.dataset.max_output_tokens)
            if total > max_len:
                raise KvplanError(
                    "dataset.max_input_tokens",
                    f"line {r.line} of the trace ({total} tokens, clipped) exceeds engine.max_model_len {max_len}",
                    "set max_input_tokens and max_output_tokens to clip the trace's lengths",
                    source=where,
                )


def with_trace_counts(workload: Workload) -> Workload:
    """``workload`` with every bucket's ``num_requests`` set to the trace's line count (after
    ``max_requests``); the same workload without a trace."""
    trace = read_trace(workload)
    if trace is None:
        return workload
    buckets = [b.model_copy(update={"num_requests": len(trace.requests)}) for b in workload.buckets]
    counted = workload.model_copy(update={"buckets": buckets})
    counted._source, counted._sha256, counted._warnings = workload.source, workload.sha256, workload.warnings
    return counted


def clipped(length: int, limit: int | None) -> int:
    """``length`` tokens cut to ``limit`` (None: no limit)."""
    return length if limit is None else min(length, limit)
