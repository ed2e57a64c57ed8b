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

A CSV trace is read too, its format told by its header's columns (more columns, in any order,
allowed; as ``kvplan profile`` tells them, kvplan.profile.csv_traces): ``azure``, the Azure LLM
inference traces (github.com/Azure/AzurePublicDataset, 2023's and 2024's
``AzureLLMInferenceTrace_*.csv``: ``TIMESTAMP,ContextTokens,GeneratedTokens``, ISO times of any
fractional precision, no offset read as UTC) and ``burstgpt`` (github.com/HPMLL/BurstGPT,
``data/BurstGPT_*.csv``: ``Timestamp`` s, ``Request tokens``, ``Response tokens``; a row with 0
response tokens is a failed request and is not replayed). A row's prompt has no hash ids (blocks of
its own); it arrives ``(time - the first row's time) / speed`` s into the level. A row that cannot
be read is one error naming the line and the column.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.workload.schema import MAX_LEVEL_S, Workload
from kvplan.workload.trace_formats.columns import (  # noqa: F401  (iso_seconds, iso_parts: re-exported)
    EXAMPLE,
    PER_SECOND,
    Row,
    cell_time,
    cell_tokens,
    check_columns,
    header_columns,
    iso_parts,
    iso_seconds,
    mapped_jsonl_rows,
)

# a trace bucket's knee and SLO search probes run at most this many of its requests, evenly spaced
# (kvplan.run.sim.search.probe_sample); the replay level itself runs every one
PROBE_REQUESTS = 1000
# bucket keys a trace replaces: lengths and counts come from its lines, arrival times from its timestamps
_REPLACED = ("input_tokens", "output_tokens", "mix", "num_requests", "concurrency", "request_rates", "arrival")
_ONE_PASS = ("duration_s", "warmup", "cooldown")  # a trace level sends each line once
# the CSV traces' columns: (time, prompt tokens, output tokens), by format (module docstring)
CSV_FORMATS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}


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
        # every id an int (not a bool: type, not isinstance) >= 0, checked in C (a million lines' ids)
        if not isinstance(ids, list) or (ids and (set(map(type, ids)) != {int} or min(ids) < 0)):
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


def csv_fields(text: str) -> list[str]:
    """A CSV line's fields, spaces around each dropped (csv's quoting read where there is a quote).

    Raises:
        csv.Error: a line csv cannot read.
    """
    if '"' not in text:
        return [cell.strip() for cell in text.split(",")]
    return [cell.strip() for cell in next(csv.reader([text]), [])]


def is_csv_header(line: str) -> bool:
    """A CSV trace's header, not a JSONL trace's line: two or more comma-separated fields, not JSON."""
    if not line or line[:1] in "{[":
        return False
    try:
        json.loads(line)
        return False
    except (json.JSONDecodeError, RecursionError):
        pass
    try:
        return len(csv_fields(line)) >= 2
    except csv.Error:
        return False


Columns = tuple[tuple[str, str], ...]  # dataset.columns as sorted (field, column) pairs, hashable


def _csv_rows(
    lines: list[tuple[int, str]], columns: Columns | None, unit: str, where: str
) -> tuple[tuple[str, str, str], Iterator[Row]]:
    """A CSV trace's replayed columns (time, prompt tokens, output tokens) and rows (module
    docstring); ``lines`` its non-blank lines, the header first: a header of a known format, or one
    holding the columns ``columns`` maps.

    Raises:
        KvplanError: a header of no known format (naming them) or without a mapped column, a row
            that cannot be read.
    """
    n, text = lines[0]
    header = csv_fields(text)
    if columns is not None:
        found, names = "mapped", header_columns(header, dict(columns), n, where)
    else:
        found = next((f for f, names in CSV_FORMATS.items() if set(names) <= set(header)), "")
        if not found:
            known = "; ".join(f"{f}: {', '.join(names)}" for f, names in CSV_FORMATS.items())
            problem = f"names no trace format kvplan knows ({', '.join(header)})"
            fix = f"give a Mooncake JSONL trace or a CSV whose header holds one format's columns: {known}; or {EXAMPLE}"
            raise KvplanError(f"line {n}: header", problem, fix, source=where)
        names = CSV_FORMATS[found]
    at = [header.index(c) for c in names]
    return (names[0], names[1], names[2]), _csv_cells(lines[1:], header, at, found == "burstgpt", unit, where)


def _csv_cells(lines: list[tuple[int, str]], header: list[str], at: list[int], burstgpt: bool, unit: str, where: str):
    for n, text in lines:
        try:
            cells = csv_fields(text)
        except csv.Error as err:
            raise KvplanError(f"line {n}", f"not a CSV row ({err})", source=where) from None
        if len(cells) != len(header):
            raise KvplanError(f"line {n}", f"{len(cells)} fields where the header has {len(header)}", source=where)
        num_input, num_output = (cell_tokens(cells[i], n, header[i], where) for i in at[1:])
        if burstgpt and num_output == 0:
            continue  # a failed request (BurstGPT's README): not a request
        yield n, cells[at[0]], *cell_time(cells[at[0]], n, header[at[0]], unit, where), num_input, num_output


def _row_requests(
    named: tuple[tuple[str, str, str], Iterator[Row]], speed: float, max_requests: int | None, where: str
) -> list[TraceRequest]:
    """Rows (``Row``) as requests, offsets from the first row's time after ``speed``; at most
    ``max_requests``. ``named``: the time, prompt and output columns' names, and the rows.

    Raises:
        KvplanError: a row before the one above it, a length under 1 token.
    """
    requests: list[TraceRequest] = []
    start: tuple[float, float] | None = None
    (time_column, *lengths), rows = named
    for n, stamp, whole, fraction, num_input, num_output in rows:
        if max_requests is not None and len(requests) >= max_requests:
            break
        for value, column in zip((num_input, num_output), lengths, strict=True):
            if value < 1:
                raise KvplanError(f"line {n}: {column}", f"must be >= 1 token (got {value})", source=where)
        start = (whole, fraction) if start is None else start
        request = TraceRequest(n, ((whole - start[0]) + (fraction - start[1])) / speed, num_input, num_output, None)
        if requests and request.offset_s < requests[-1].offset_s:
            problem = f"{stamp} is before line {requests[-1].line}'s"
            raise KvplanError(f"line {n}: {time_column}", problem, "sort the trace by time", source=where)
        requests.append(request)
    return requests


@lru_cache(maxsize=8)
def _read(
    path: str,
    size: int,
    mtime_ns: int,
    speed: float,
    max_requests: int | None,
    block_tokens: int,
    columns: Columns | None = None,
    unit: str = "s",
) -> Trace:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # an editor's or spreadsheet's byte-order mark
    except (OSError, UnicodeDecodeError) as err:
        raise KvplanError("", f"cannot read the trace ({err})", source=path) from None
    numbered = [(n, raw) for n, raw in enumerate(text.splitlines(), start=1) if raw.strip()]
    if numbered and is_csv_header(numbered[0][1].strip()):
        requests = _row_requests(_csv_rows(numbered, columns, unit, path), speed, max_requests, path)
        if not requests:
            raise KvplanError("", "the trace has no requests (no rows after the header)", source=path)
        return Trace(tuple(requests))
    if columns is not None:
        named = check_columns(dict(columns), path), mapped_jsonl_rows(numbered, dict(columns), unit, path)
        requests = _row_requests(named, speed, max_requests, path)
        if not requests:
            raise KvplanError("", "the trace has no requests (no non-blank lines)", source=path)
        return Trace(tuple(requests))
    requests = []
    for number, raw in numbered:
        if max_requests is not None and len(requests) >= max_requests:
            break
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
            bad field (naming the line and the field), timestamps out of order; a CSV header of no
            known format, a row that cannot be read.
    """
    dataset, path = workload.dataset, workload.dataset_path
    if dataset.kind != "trace" or path is None:
        return None
    stat = path.stat()
    columns = None if dataset.columns is None else tuple(sorted(dataset.columns.items()))
    if columns is not None:
        check_columns(dict(columns), workload.source)
    key = (str(path), stat.st_size, stat.st_mtime_ns, dataset.speed, dataset.max_requests, dataset.block_tokens)
    return _read(*key, columns, dataset.time_unit)


def check_trace(workload: Workload) -> None:
    """The rules a trace sets across sections (kvplan.workload.file runs them): buckets that
    take everything from the trace, no sessions or shared prefix, and a request rate (arrivals not
    all at once). A trace of any span is read; one replayed whole is checked by ``check_replay``.

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


def check_replay(workload: Workload) -> None:
    """A trace replayed whole as one level (kvplan simulate, loadtest, advise) spans at most a
    level's ``MAX_LEVEL_S`` (24 h): a load test sends in real time, so a longer level runs for days,
    and a simulation of it holds every request of the span. A longer trace (the Azure 2024 traces
    run a week) is sized window by window (``kvplan plan --window``, which replays each window's own
    requests) and profiled (``kvplan profile``); neither is a level, so neither is refused.

    Raises:
        KvplanError: ``dataset.speed``: the last arrival over 24 h in, after ``speed``.
    """
    trace = read_trace(workload)
    if trace is None or trace.requests[-1].offset_s <= MAX_LEVEL_S:
        return
    last, hours = trace.requests[-1], MAX_LEVEL_S // 3600
    raise KvplanError(
        "dataset.speed",
        f"line {last.line} arrives {last.offset_s / 3600:.3g} h in: a whole replay is one level, at most {hours} h",
        "size a longer trace window by window (kvplan plan --window 3600), or raise speed or lower max_requests",
        source=workload.source,
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
