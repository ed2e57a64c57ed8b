"""A trace's columns (``kvplan profile --columns``): which column holds each field of a request, and
how a cell becomes seconds or tokens.

The CSV formats kvplan knows (kvplan.profile.csv_traces) and a user's ``--columns`` map name their
columns the same way, as a ``ColumnMap``: ``timestamp``, ``input_tokens`` and ``output_tokens``
(required), ``session``, ``latency`` and ``finish`` (optional). A cell is a CSV field (text) or a
JSONL line's value (a number or text).

- Times (``timestamp``, ``finish``): a number in ``time_unit`` (``s``, ``ms`` or ``us``), scaled to
  seconds; or ISO 8601 text, the date and time split by ``T`` or a space, with any number of
  fractional-second digits (the Azure 2023 traces give seven, ``2023-11-16 18:17:03.9799600``,
  beyond strptime's ``%f``, which takes six; all are kept, not cut to microseconds) and an optional
  ``Z`` or ``+HH:MM`` offset. Text without an offset is read as UTC, so a trace's clock never
  depends on the machine's time zone (and no daylight-saving jump opens a gap in it).
- ``latency``: arrival to the complete response, a number in ``time_unit``; the finish is
  ``timestamp + latency``. ``finish``: the response's time, as a time above, at or after the arrival.
- Lengths: a whole number of tokens >= 0, at most kvplan.profile.log.MAX_TOKENS (``472``, ``472.0``).
- ``session``: any text or number; an empty cell is no session.

A cell that cannot be read raises the reader's bad-line error (``line N: COLUMN: problem``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.profile.log import MAX_TOKENS, LoggedRequest, _Bad, _seconds
from kvplan.workload import trace

TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}  # a numeric time's unit -> seconds
FIELDS = ("timestamp", "input_tokens", "output_tokens", "session", "latency", "finish")
REQUIRED = FIELDS[:3]
EXAMPLE = "timestamp=TIME,input_tokens=PROMPT_TOKENS,output_tokens=OUTPUT_TOKENS"


@dataclass(frozen=True)
class ColumnMap:
    """The column that holds each field (None: the trace has none); ``time_unit``: numeric times'
    unit (a key of ``TIME_UNITS``)."""

    timestamp: str
    input_tokens: str
    output_tokens: str
    session: str | None = None
    latency: str | None = None
    finish: str | None = None
    time_unit: str = "s"

    def named(self) -> dict[str, str]:
        """Field -> column, for the fields given."""
        return {name: column for name in FIELDS if (column := getattr(self, name)) is not None}


def parse_columns(text: str, time_unit: str | None = None) -> ColumnMap:
    """``--columns FIELD=COLUMN,...`` (and ``--time-unit``) as a ColumnMap. A column name holds no
    comma or ``=``; spaces around names are dropped (BurstGPT's ``Request tokens`` keeps its inner
    one).

    Raises:
        KvplanError: ``columns``: an item not FIELD=COLUMN, an unknown or repeated field, an empty
        column, a required field missing; ``time_unit``: not s, ms or us.
    """
    unit = "s" if time_unit is None else time_unit
    if unit not in TIME_UNITS:
        raise KvplanError("time_unit", f"must be one of {', '.join(TIME_UNITS)} (got {unit!r})")
    fields: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        name, sep, column = (part.strip() for part in item.partition("="))
        if not sep:
            raise KvplanError("columns", f"{item!r} is not FIELD=COLUMN", f"give e.g. `columns` {EXAMPLE}")
        if name not in FIELDS:
            raise KvplanError("columns", f"unknown field {name!r}; the fields are {', '.join(FIELDS)}")
        if name in fields:
            raise KvplanError("columns", f"{name} is given twice")
        if not column:
            raise KvplanError("columns", f"{name} names no column", f"give {name}=COLUMN")
        fields[name] = column
    missing = [name for name in REQUIRED if name not in fields]
    if missing:
        raise KvplanError("columns", f"missing {', '.join(missing)}", f"give e.g. `columns` {EXAMPLE}")
    return ColumnMap(**fields, time_unit=unit)


def _empty(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def cell_number(value: object, column: str) -> float:
    """A number, or text that is one (``12``, ``-0.5``, ``1e3``), finite."""
    if value is None:
        raise _Bad(column, "missing")
    if isinstance(value, str) and not value.strip():
        raise _Bad(column, "empty")
    try:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError
        number = float(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise _Bad(column, f"must be a number (got {value!r})") from None
    except OverflowError:  # an int beyond a float's range
        raise _Bad(column, "must be a finite number (got an integer beyond a float's range)") from None
    if not math.isfinite(number):
        raise _Bad(column, f"must be a finite number (got {value!r})")
    return number


def cell_tokens(value: object, column: str) -> int:
    """A length: a whole number of tokens, 0 to MAX_TOKENS."""
    number = cell_number(value, column)
    if number < 0:
        raise _Bad(column, f"must be >= 0 (got {number:g})")
    if number > MAX_TOKENS:
        raise _Bad(column, f"must be at most {MAX_TOKENS:,} tokens (got {number:.3g})")
    if number != int(number):
        raise _Bad(column, f"must be a whole number of tokens (got {number:g})")
    return int(number)


def iso_seconds(text: str, column: str) -> float:
    """ISO 8601 text as seconds since the Unix epoch (UTC), every fractional digit kept
    (kvplan.workload.trace.iso_seconds, which trace replay reads CSV traces with)."""
    try:
        return trace.iso_seconds(text)
    except ValueError:
        raise _Bad(column, f"is not a number or an ISO 8601 time (got {text!r})") from None


def cell_time(value: object, column: str, scale: float) -> float:
    """A time in seconds: a number (or numeric text) times ``scale``, or ISO 8601 text."""
    if isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            float(text)
        except ValueError:
            return _seconds(iso_seconds(text, column), column)
    return _seconds(cell_number(value, column) * scale, column)


def row_request(line: int, row: Mapping[str, object], columns: ColumnMap, fmt: str) -> LoggedRequest:
    """One row (column -> cell) as a request of format ``fmt``, no token ids (see the module docstring).

    Raises:
        _Bad: a cell that cannot be read (kvplan.profile.log's bad-line error).
    """
    scale = TIME_UNITS[columns.time_unit]
    arrival = cell_time(row.get(columns.timestamp), columns.timestamp, scale)
    num_input = cell_tokens(row.get(columns.input_tokens), columns.input_tokens)
    num_output = cell_tokens(row.get(columns.output_tokens), columns.output_tokens)
    finish = None
    if columns.latency is not None and not _empty(row.get(columns.latency)):
        latency = cell_number(row.get(columns.latency), columns.latency) * scale
        if latency < 0:
            raise _Bad(columns.latency, f"must be >= 0 (got {latency:g} s)")
        finish = _seconds(arrival + latency, columns.latency)
    if columns.finish is not None and not _empty(row.get(columns.finish)):
        finish = cell_time(row.get(columns.finish), columns.finish, scale)
        if finish < arrival:
            raise _Bad(columns.finish, f"must be at or after the arrival (got {arrival - finish:.6g} s before it)")
    session = row.get(columns.session) if columns.session is not None else None
    if isinstance(session, dict | list):
        raise _Bad(str(columns.session), f"must be text or a number (got {type(session).__name__})")
    session_id = None if _empty(session) else str(session).strip()
    return LoggedRequest(line, fmt, arrival, num_input, num_output, session=session_id, finish_s=finish)
