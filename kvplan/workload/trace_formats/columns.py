"""A trace's rows read through a column mapping (``dataset: {kind: trace, columns: {...}}``), and
the cells every CSV trace shares: the replay's side of ``kvplan profile --columns``.

``columns`` maps fields to the trace's column names, with the fields ``kvplan profile --columns``
takes (kvplan.profile.columns): ``timestamp``, ``input_tokens`` and ``output_tokens`` are required
and replayed; ``session``, ``latency`` and ``finish`` are allowed (so one mapping serves profile and
replay) and must name columns the trace has, but a replay does not read them (a trace line is one
request, sent at its time). The file is a CSV (the first non-blank line its header) or JSONL (one
object a line, the columns its keys).

- ``timestamp``: a number in ``dataset.time_unit`` (``s``, ``ms`` or ``us``; a JSON number or
  numeric text), or ISO 8601 text of any fractional precision (``iso_parts``);
  the request arrives ``(time - the first row's time) / speed`` s into the level.
- ``input_tokens``, ``output_tokens``: a whole number of tokens >= 1 (``472`` or ``472.0``).

Rows (``Row``): ``(line, the time cell, whole seconds, fraction of a second, input tokens, output
tokens)``; a time keeps its fraction apart so that differences of ISO times stay exact.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime

from kvplan.errors import KvplanError

FIELDS = ("timestamp", "input_tokens", "output_tokens", "session", "latency", "finish")
REPLAYED = FIELDS[:3]  # the required fields, the ones a replay reads
PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6}  # a numeric time's unit -> its count per second
_FRACTION = re.compile(r"(?<=\d\d:\d\d:\d\d)[.,](\d+)")  # the fractional seconds after hh:mm:ss
EXAMPLE = "columns: {timestamp: TIME, input_tokens: PROMPT_TOKENS, output_tokens: OUTPUT_TOKENS}"

Row = tuple[int, object, float, float, int, int]  # line, time cell, seconds, fraction, tokens in, tokens out


def check_columns(columns: Mapping[str, str], where: str) -> tuple[str, str, str]:
    """The mapping's replayed columns (timestamp, input_tokens, output_tokens), its fields checked.

    Raises:
        KvplanError: ``dataset.columns``: an unknown field, an empty column name, a required field
        missing.
    """
    for name, column in columns.items():
        if name not in FIELDS:
            problem = f"unknown field {name!r}; the fields are {', '.join(FIELDS)}"
            raise KvplanError("dataset.columns", problem, source=where)
        if not column.strip():
            raise KvplanError(f"dataset.columns.{name}", "names no column", f"give {name}: COLUMN", source=where)
    missing = [name for name in REPLAYED if name not in columns]
    if missing:
        raise KvplanError("dataset.columns", f"missing {', '.join(missing)}", f"give e.g. {EXAMPLE}", source=where)
    t, i, o = (columns[name].strip() for name in REPLAYED)
    return t, i, o


def header_columns(header: Sequence[str], columns: Mapping[str, str], n: int, where: str) -> tuple[str, str, str]:
    """The replayed columns of a CSV header that holds every column ``columns`` names.

    Raises:
        KvplanError: ``line N: header``: a mapped column the header lacks (listing its columns).
    """
    replayed = check_columns(columns, where)
    for name, column in columns.items():
        if column.strip() not in header:
            problem = f"has no column {column.strip()!r}, which dataset.columns maps {name} to"
            raise KvplanError(f"line {n}: header", f"{problem} (its columns: {', '.join(header)})", source=where)
    return replayed


def cell_time(cell: object, n: int, column: str, unit: str, where: str) -> tuple[float, float]:
    """A time cell as (seconds, a fraction to add): a number in ``unit`` (a key of PER_SECOND;
    numeric text too), or ISO 8601 text (``iso_parts``).

    Raises:
        KvplanError: ``line N: COLUMN``: missing, not a number or an ISO time, not finite.
    """
    problem = f"is not a number of {unit} or an ISO 8601 time (got {cell!r})"
    bad = KvplanError(f"line {n}: {column}", problem, source=where)
    if isinstance(cell, bool) or not isinstance(cell, str | int | float):
        raise bad
    if isinstance(cell, str):
        try:
            value = float(cell)
        except ValueError:
            try:
                return iso_parts(cell.strip())
            except ValueError:
                raise bad from None
    else:
        value = float(cell)
    if not math.isfinite(value):
        raise KvplanError(f"line {n}: {column}", f"must be a finite time (got {cell!r})", source=where)
    return value / PER_SECOND[unit], 0.0


def iso_seconds(text: str) -> float:
    """ISO 8601 text (date and time split by ``T`` or a space) as seconds since the Unix epoch, every
    fractional digit read (strptime's ``%f`` takes six; the Azure 2023 traces give seven); no offset
    is read as UTC, so a trace's clock never depends on the machine's zone. (A float of seconds since
    1970 resolves about 0.2 us; ``iso_parts`` keeps the fraction apart, for exact differences.)

    Raises:
        ValueError: not an ISO 8601 time.
    """
    whole, fraction = iso_parts(text)
    return whole + fraction


def iso_parts(text: str) -> tuple[int, float]:
    """ISO 8601 text as whole seconds since the Unix epoch and the fraction of a second (``iso_seconds``).

    Raises:
        ValueError: not an ISO 8601 time.
    """
    fraction, rest = 0.0, text
    match = _FRACTION.search(text)
    if match:
        fraction, rest = float("0." + match[1]), text[: match.start()] + text[match.end() :]
    try:
        when = datetime.fromisoformat(rest)
        return int((when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()), fraction
    except (OverflowError, OSError):
        raise ValueError(f"not an ISO 8601 time: {text!r}") from None


def cell_tokens(cell: object, n: int, column: str, where: str) -> int:
    """A length cell: a whole number of tokens >= 0 (``472``, ``472.0``, as text or a number).

    Raises:
        KvplanError: ``line N: COLUMN``: anything else.
    """
    value = math.nan
    if isinstance(cell, str):
        try:
            value = float(cell)
        except ValueError:
            pass
    elif isinstance(cell, int | float) and not isinstance(cell, bool):
        value = float(cell)
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise KvplanError(f"line {n}: {column}", f"must be a whole number of tokens >= 0 (got {cell!r})", source=where)
    return int(value)


def mapped_jsonl_rows(
    lines: Sequence[tuple[int, str]], columns: Mapping[str, str], unit: str, where: str
) -> Iterator[Row]:
    """A JSONL trace's rows read through ``columns`` (module docstring), in file order.

    Raises:
        KvplanError: a line that is not a JSON object, a mapped key missing, a cell that cannot be read.
    """
    t, i, o = check_columns(columns, where)
    for n, text in lines:
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise KvplanError(f"line {n}", f"not valid JSON ({err.msg})", source=where) from None
        if not isinstance(row, dict):
            raise KvplanError(f"line {n}", "each line must be a JSON object", source=where)
        for column in (t, i, o):
            if column not in row:
                raise KvplanError(f"line {n}: {column}", "missing (dataset.columns names it)", source=where)
        whole, fraction = cell_time(row[t], n, t, unit, where)
        yield n, row[t], whole, fraction, cell_tokens(row[i], n, i, where), cell_tokens(row[o], n, o, where)
