"""Read a trace for ``kvplan profile``: the field's public CSV traces (Azure's, BurstGPT), any CSV or
JSONL whose columns ``--columns`` names, and every JSONL log kvplan.profile.log reads (sent there).

A file's format is told by its first non-blank line, or forced with ``fmt``: a line that opens with
``{`` or ``[``, or is JSON, starts a JSONL log; any other line of two or more comma-separated
fields is a CSV header, and its columns name the format (more columns allowed, in any order):

- ``azure``: the Azure LLM inference traces (github.com/Azure/AzurePublicDataset): 2023's
  data/AzureLLMInferenceTrace_code.csv and data/AzureLLMInferenceTrace_conv.csv
  (AzureLLMInferenceDataset2023.md), 2024's week-long AzureLLMInferenceTrace_code_1week.csv and
  AzureLLMInferenceTrace_conv_1week.csv (AzureLLMInferenceDataset2024.md). Header
  ``TIMESTAMP,ContextTokens,GeneratedTokens``: the invocation time as ISO text (2023:
  ``2023-11-16 18:17:03.9799600``, no offset, read as UTC; 2024: ``2024-05-10 00:00:00.009930+00:00``
  or ``2024-05-12 00:00:00+00:00``), the prompt's tokens, the output's.
- ``burstgpt``: BurstGPT (github.com/HPMLL/BurstGPT, data/BurstGPT_1.csv and the releases'
  BurstGPT_*.csv; README.md): ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``,
  ``Timestamp`` in s from 0:00:00 on the trace's first day. Release v2.0 adds ``Session ID`` (a
  conversation, on conversation-mode rows; the README also spells it ``SessionID``) and ``Elapsed
  time`` (s, from the request's submission to its complete response, so finish = Timestamp +
  Elapsed time), read when present. A row with 0 ``Response tokens`` is a failed request (the
  README's "failure"): counted in ``num_failed``, never a request. Model, Total tokens and Log
  Type are not read.
- ``mapped``: with ``columns`` (kvplan.profile.columns.ColumnMap): a CSV whose header holds every
  column named, or a JSONL log whose lines hold them as keys.

These traces carry no token ids: the lengths and times are their columns', and prefix reuse is
unknown (as in a kvplan request log, no token ids; unlike it, no engine's cached-token count
either), so it counts 0, and a note says so. Rows are read as kvplan.profile.log reads lines:
UTF-8, a byte order mark allowed, LF or CRLF; a row that cannot be read is a BadLine (``line N:
COLUMN: problem``; ``line N: csv: ...`` for a row whose fields the header does not match), and only
a file without one good row is a KvplanError.
"""

from __future__ import annotations

import codecs
import csv
from dataclasses import replace
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.profile import log
from kvplan.profile.columns import EXAMPLE, ColumnMap, row_request
from kvplan.profile.log import BadLine, LoggedRequest, ParsedLog, Tokenize, _Bad, _json_line, file_lines
from kvplan.profile.parsed import check_level, read_log
from kvplan.workload.trace import CSV_FORMATS, csv_fields, is_csv_header

AZURE = ColumnMap(*CSV_FORMATS["azure"])  # one list of the formats' columns, trace replay's too
BURSTGPT = ColumnMap(*CSV_FORMATS["burstgpt"])
BURSTGPT_SESSION = ("Session ID", "SessionID")  # release v2.0's column, both spellings its README uses
BURSTGPT_ELAPSED = "Elapsed time"  # s, submission to the complete response (release v2.0)
KNOWN = {"azure": AZURE, "burstgpt": BURSTGPT}  # the CSV formats, told by their header's columns
FORMATS: tuple[str, ...] = (*log.FORMATS, *KNOWN, "mapped")
SNIFF_BYTES = 1 << 16  # read of a file's start to tell CSV from JSONL


def read_trace(
    path: str | Path,
    fmt: str = "auto",
    tokenize: Tokenize | None = None,
    level: str | None = None,
    columns: ColumnMap | None = None,
) -> ParsedLog:
    """The trace or log at ``path`` read in its format (see the module docstring), the format named
    in ``log_format`` (a JSONL log's: ``fmt``, or auto the first good line's). ``tokenize`` and
    ``level`` are kvplan.profile.parsed.read_log's.

    Raises:
        KvplanError: ``columns`` beside a ``fmt`` other than auto or mapped, or mapped without it;
        what read_log raises; a CSV header of no known format (the known ones listed) or without a
        column its format needs; a file without one good row (the first bad row named).
    """
    if columns is not None and fmt not in ("auto", "mapped"):
        raise KvplanError("columns", f"names a trace's columns itself; it cannot go with `log_format` {fmt}")
    if fmt == "mapped" and columns is None:
        raise KvplanError("log_format", "mapped reads the columns `columns` names, and none was given", EXAMPLE)
    kind = sniff(path) if fmt in ("auto", "mapped") else ("csv" if fmt in KNOWN else "jsonl")
    if kind == "jsonl" and columns is None:
        parsed = read_log(path, fmt, tokenize, level)
        first = min(parsed.requests, key=lambda r: r.line).fmt
        return replace(parsed, log_format=fmt if fmt != "auto" else first)
    source = str(path)
    check_level(level, (), source)  # a CSV trace or a mapped log holds no load levels
    lines = _lines(path)
    if kind == "jsonl" and columns is not None:
        return _parsed(source, "mapped", *_mapped_jsonl(lines, columns))
    return _read_csv(source, lines, fmt, columns)


def sniff(path: str | Path) -> str:
    """``csv`` or ``jsonl``: what the file's first non-blank line is (jsonl where the file cannot be
    read or is gzip-compressed, so read_log names its fault)."""
    try:
        with open(path, "rb") as file:
            head = file.read(SNIFF_BYTES)
    except OSError:
        return "jsonl"
    if head.startswith(b"\x1f\x8b"):
        return "jsonl"
    first = next((raw for raw in head.removeprefix(codecs.BOM_UTF8).split(b"\n") if raw.strip()), b"")
    return "csv" if _is_header(first.strip()) else "jsonl"


def _is_header(raw: bytes) -> bool:
    try:
        return is_csv_header(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return False


def _fields(text: str) -> list[str]:
    """A CSV line's fields, spaces around each dropped (csv's quoting read where there is a quote)."""
    try:
        return csv_fields(text)
    except csv.Error as err:
        raise _Bad("csv", f"not a CSV row ({err})") from None


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError as err:
        raise _Bad("utf-8", f"not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1})") from None


def _lines(path: str | Path) -> list[tuple[int, bytes]]:
    """The file's non-blank lines, numbered from 1 (a byte order mark dropped), as read_log reads them."""
    return [(n, raw) for n, _, raw in file_lines(path, "CSV or JSONL")]


def header_format(line: int, header: list[str], fmt: str, columns: ColumnMap | None, source: str):
    """The format a CSV header names and the columns it is read by: ``mapped`` with ``columns``,
    ``fmt`` when forced, else the first of KNOWN whose columns it holds (BurstGPT's session and
    elapsed time added when present).

    Raises:
        KvplanError: ``line N: header``: a mapped or forced format's column missing; no known format.
    """
    where, present = f"line {line}: header", set(header)
    listed = f"(its columns: {', '.join(header)})"
    if columns is not None:
        for name, column in columns.named().items():
            if column not in present:
                problem = f"has no column {column!r}, which `columns` maps {name} to {listed}"
                raise KvplanError(where, problem, source=source)
        return "mapped", columns
    if fmt in KNOWN:
        missing = [c for c in KNOWN[fmt].named().values() if c not in present]
        if missing:
            raise KvplanError(where, f"has no column {missing[0]!r}, which {fmt} traces have {listed}", source=source)
    found = fmt if fmt in KNOWN else next((k for k, m in KNOWN.items() if set(m.named().values()) <= present), None)
    if found is None:
        known = "; ".join(f"{k}: {', '.join(m.named().values())}" for k, m in KNOWN.items())
        fix = f"the known formats' columns are {known}; or name this trace's with `columns` {EXAMPLE}"
        raise KvplanError(where, f"names no trace format kvplan knows ({', '.join(header)})", fix, source=source)
    spec = KNOWN[found]
    if found == "burstgpt":
        session = next((c for c in BURSTGPT_SESSION if c in present), None)
        spec = replace(spec, session=session, latency=BURSTGPT_ELAPSED if BURSTGPT_ELAPSED in present else None)
    return found, spec


def csv_header(
    n: int, raw: bytes, fmt: str, columns: ColumnMap | None, source: str
) -> tuple[list[str], str, ColumnMap]:
    """The header line's columns, the format they name and the columns it is read by (header_format).

    Raises:
        KvplanError: the header is not a CSV row; what header_format raises.
    """
    try:
        header = _fields(_text(raw))
    except _Bad as err:
        raise KvplanError(f"line {n}: {err.field}", err.problem, source=source) from None
    return (header, *header_format(n, header, fmt, columns, source))


def csv_row(n: int, raw: bytes, header: list[str], spec: ColumnMap, name: str) -> LoggedRequest:
    """Row ``n`` as a request (a failed one too: BurstGPT's 0 response tokens, ``failed`` tells).

    Raises:
        _Bad: the row cannot be read.
    """
    cells = _fields(_text(raw))
    if len(cells) != len(header):
        raise _Bad("csv", f"{len(cells)} fields where the header has {len(header)}")
    return row_request(n, dict(zip(header, cells)), spec, name)


def failed(name: str, request: LoggedRequest) -> bool:
    """A failed request, never taken as one: a BurstGPT row with 0 response tokens."""
    return name == "burstgpt" and request.output_tokens == 0


def mapped_row(n: int, raw: bytes, columns: ColumnMap) -> LoggedRequest:
    """A JSONL line read through ``columns``. Raises _Bad: the line cannot be read."""
    row = _json_line(raw)
    if not isinstance(row, dict):
        raise _Bad("json", f"must be an object (got {type(row).__name__})")
    return row_request(n, row, columns, "mapped")


def _read_csv(source: str, lines: list[tuple[int, bytes]], fmt: str, columns: ColumnMap | None) -> ParsedLog:
    header, name, spec = csv_header(*lines[0], fmt, columns, source)
    requests: list[LoggedRequest] = []
    bad: list[BadLine] = []
    failures: list[int] = []  # lines of failed requests
    for n, raw in lines[1:]:
        try:
            request = csv_row(n, raw, header, spec, name)
        except _Bad as err:
            bad.append(BadLine(n, err.field, err.problem))
            continue
        if failed(name, request):
            failures.append(n)
        else:
            requests.append(request)
    return _parsed(source, name, requests, bad, failures)


def _mapped_jsonl(lines: list[tuple[int, bytes]], columns: ColumnMap):
    requests: list[LoggedRequest] = []
    bad: list[BadLine] = []
    for n, raw in lines:
        try:
            requests.append(mapped_row(n, raw, columns))
        except _Bad as err:
            bad.append(BadLine(n, err.field, err.problem))
    return requests, bad, []


def no_good_row(source: str, first_bad: BadLine | None, first_failed: int | None, num_failed: int) -> KvplanError:
    """The error of a trace without one good row: its first bad row, its first failed request, or no row."""
    if first_bad is not None:
        return KvplanError(f"line {first_bad.line}: {first_bad.field}", first_bad.problem, source=source)
    if first_failed is not None:
        problem = f"0 (a failed request); all {num_failed} rows are failed requests"
        return KvplanError(f"line {first_failed}: Response tokens", problem, source=source)
    return KvplanError("", "no rows after the header", "give a trace with one request a row", source=source)


def csv_notes(name: str, num_failed: int) -> tuple[str, ...]:
    """What a trace's numbers leave out: its prefix reuse, its failed requests."""
    notes = [f"{name} rows carry no token ids: their prefix reuse is unknown (prefix_reuse reads 0)"]
    if num_failed:
        plural = "s" if num_failed != 1 else ""
        notes.append(f"{num_failed} failed request{plural} (Response tokens 0) left out: num_failed_requests")
    return tuple(notes)


def _parsed(
    source: str, name: str, requests: list[LoggedRequest], bad: list[BadLine], failures: list[int]
) -> ParsedLog:
    """The good rows in arrival order (ties in line order), with the notes on what they leave out.

    Raises:
        KvplanError: no good row: the first bad row, the first failed request, or no row at all.
    """
    if not requests:
        raise no_good_row(source, bad[0] if bad else None, failures[0] if failures else None, len(failures))
    order = sorted(requests, key=lambda r: (r.arrival_s, r.line))
    notes = csv_notes(name, len(failures))
    return ParsedLog(source, tuple(order), tuple(bad), notes=notes, log_format=name, num_failed=len(failures))
