"""The records as CSV: requests.csv and steps.csv (views of requests.jsonl and steps.jsonl), and
a table held as columns written as CSV text byte for byte as pandas writes it, without pandas.

steps.csv of a long simulation is a million rows of some 45 columns (a 20,000-request trace:
1,341,207 steps; docs/benchmarks.md#trace-20k). pandas builds a DataFrame from the columns, works
out each column's dtype and formats every cell before its csv writer joins them; ``csv_chunks``
hands the same cells to the same writer (Python's ``csv`` module, which pandas' ``to_csv`` uses)
a chunk of rows at a time, each column made to hold what pandas would pass it:

- a column of ``int`` only (pandas: int64): the ints, written as ``str`` writes them;
- ints and floats or None, floats and None (pandas: float64): floats (an int as ``float(int)``),
  None and NaN as an empty cell (float64's ``astype(str)``, what pandas writes, is
  ``repr(float)``: the shortest round-trip digits, an exponent below 1e-4 and from 1e16);
- anything with a str or bool, only None, or a column named in ``as_object`` (pandas: object):
  each value by ``str``, None and NaN empty.

Values of any other type (a tuple, a numpy scalar, an int beyond int64) make ``csv_chunks``
answer None: the table is built through pandas then.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.results import metrics
from kvplan.results.records import RequestRecord, StepRecord
from kvplan.results.rows import StepRows
from kvplan.results.rows import column as record_column
from kvplan.results.stats.shed import TENANT_COLUMNS, tenant_step_cells
from kvplan.results.store import write_atomic

if TYPE_CHECKING:
    import pandas as pd  # imported where a table needs it (0.4 s here): most never do

_PLAIN = frozenset({int, float, str, bool, type(None)})
_NUMERIC = frozenset({int, float, type(None)})
_INT64 = (-(2**63), 2**63 - 1)
CHUNK_ROWS = 65_536


def csv_chunks(
    columns: Mapping[str, Sequence[Any]], as_object: Sequence[str] = (), chunk_rows: int = CHUNK_ROWS
) -> Iterator[str] | None:
    """``pd.DataFrame(columns).to_csv(index=False)`` (each column in ``as_object`` given
    ``dtype=object``) as successive pieces of its text: the header, then ``chunk_rows`` rows at a
    time. Every column holds the same number of rows (at least one) and there are two or more
    columns. None when a column holds a value of a type this does not format as pandas does (see
    the module's docstring): build the table with pandas then.

    Raises:
        ValueError: columns of different lengths, fewer than two columns, or no rows.
    """
    names = list(columns)
    lengths = {len(c) for c in columns.values()}
    if len(names) < 2 or len(lengths) != 1 or not lengths.pop():
        raise ValueError("csv_chunks: two or more columns of the same, non-zero length")
    cells, kinds = [], []
    for name in names:
        made = _as_pandas(columns[name], name in as_object)
        if made is None:
            return None
        cells.append(made[0])
        kinds.append(made[1])
    return _chunks(names, cells, chunk_rows, kinds)


def _chunks(
    names: list[str], cells: list[Sequence[Any]], chunk_rows: int, kinds: Sequence[type | None] = ()
) -> Iterator[str]:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")  # pandas' to_csv: QUOTE_MINIMAL, '"', os.linesep
    writer.writerow(names)
    rows = len(cells[0])
    for start in range(0, rows, chunk_rows):
        chunk = [c[start : start + chunk_rows] for c in cells]
        template = _row_template(chunk, kinds)
        if template is None:
            writer.writerows(zip(*chunk))
        else:  # the csv writer's own text, a row by one % (a million rows of a long simulation)
            template, chunk = _fixed_cells(template, chunk)
            out.write("".join(map(template.__mod__, zip(*chunk))))
        yield out.getvalue()
        out.seek(0)
        out.truncate()
    if out.tell():
        yield out.getvalue()


def _row_template(chunk: list[Sequence[Any]], known: Sequence[type | None] = ()) -> str | None:
    """A %-template writing each row of ``chunk`` (its columns) as the csv writer writes it, or
    None: where every column holds one type the writer formats without a choice (an int by
    ``str``, a float by ``repr``, which ``%d`` and ``%r`` write, a str it would not quote).
    ``known``: the one type of each column's cells where the caller knows it (None: not known)."""
    formats = []
    for i, column in enumerate(chunk):
        kind = known[i] if i < len(known) else None
        kinds = {kind} if kind is not None else set(map(type, column))
        if kinds == {int}:
            formats.append("%d")
        elif kinds == {float}:
            formats.append("%r")
        elif kinds == {str} and all(map(unquoted, set(column))):
            formats.append("%s")
        else:
            return None
    return ",".join(formats) + "\n"


def _fixed_cells(template: str, chunk: list[Sequence[Any]]) -> tuple[str, list[Sequence[Any]]]:
    """``template`` (``_row_template``'s, of ``chunk``) and ``chunk`` with the cells that need no
    work per row taken out: a column of ints or strings holding one value in every row becomes
    its text in the template (steps.csv's counters that a level never moves: the offload tiers',
    the pool's size, the bucket); float columns become their reprs (``_float_texts``), taken by %s."""
    formats = template[:-1].split(",")
    floats = [i for i, f in enumerate(formats) if f == "%r"]
    if floats:
        chunk = _float_texts(chunk, floats)
    parts, kept = [], []
    for f, column in zip(formats, chunk):
        first = column[0]
        if f != "%r" and column.count(first) == len(column):  # one int or str: ==, exact types
            parts.append((f % first).replace("%", "%%"))
        else:
            parts.append("%s" if f == "%r" else f)
            kept.append(column)
    if not kept:  # every column fixed: zip() of none would give no rows
        return ",".join("%s" if f == "%r" else f for f in formats) + "\n", chunk
    return ",".join(parts) + "\n", kept


def _float_texts(chunk: list[Sequence[Any]], positions: list[int]) -> list[Sequence[Any]]:
    """``chunk`` with its columns at ``positions`` (floats only, no NaN) as their values' reprs,
    each distinct value's made once over those columns: steps.csv's level is one value per level,
    a step's start time the step before's end, its KV usage one of few. Equal floats are the same
    double, with the same repr, but for 0.0 and -0.0 (equal, written apart): those are made one by
    one."""
    distinct = set().union(*(chunk[i] for i in positions))
    memo = dict(zip(distinct, map(float.__repr__, distinct)))
    memo.pop(0.0, None)
    out = list(chunk)
    for i in positions:
        texts = list(map(memo.get, chunk[i]))
        if None in texts:
            texts = [float.__repr__(v) if t is None else t for t, v in zip(texts, chunk[i])]
        out[i] = texts
    return out


def unquoted(text: str) -> bool:
    """Whether the csv writer writes ``text`` as it is, beside another cell (no quotes, no escapes)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow([text, ""])
    return out.getvalue() == text + ",\n"


def _as_pandas(values: Sequence[Any], as_object: bool) -> tuple[Sequence[Any], type | None] | None:
    """The column as pandas hands its cells to the csv writer (None and '' both write an empty
    cell), with the one type of its cells where that is known here (else None); None for a type
    it does not take."""
    types = set(map(type, values))
    if not types <= _PLAIN:
        return None
    if as_object or not types <= _NUMERIC or types == {type(None)}:  # an object column
        if float in types:
            return [None if type(v) is float and math.isnan(v) else v for v in values], None
        return values, next(iter(types)) if len(types) == 1 else None
    if types == {int}:
        # beyond int64 pandas would hold it as uint64 or object
        return (values, int) if _INT64[0] <= min(values) and max(values) <= _INT64[1] else None
    if int in types and not all(_INT64[0] <= v <= _INT64[1] for v in values if type(v) is int):
        return None
    # float64: ints as floats, None and NaN empty
    return [None if v is None or v != v else float(v) for v in values], None


# ---- the records as CSV -----------------------------------------------------------------------
_REQUEST_CSV_FIELDS = tuple(f.name for f in fields(RequestRecord) if f.name != "token_times")


def request_row(rec: RequestRecord) -> dict[str, Any]:
    """The requests.csv row: scalars plus derived latencies in ms (empty when undefined)."""
    row = {name: getattr(rec, name) for name in _REQUEST_CSV_FIELDS}
    ms = lambda s: None if s is None else s * 1e3  # noqa: E731
    e2e = None if rec.finish_reason == "rejected" else metrics.e2e_s(rec)  # refused at the entry: no latency
    row.update(ttft_ms=ms(metrics.ttft_s(rec)), tpot_ms=ms(metrics.tpot_s(rec)), e2e_ms=ms(e2e))
    row["ttfo_ms"] = ms(metrics.ttfo_s(rec))  # a target's reasoning stream only (else empty)
    return row


# the step fields steps.csv leaves out (each step's arrays): ``step_row`` adds counts of them
STEP_CSV_SKIPPED = ("kv_resident_tokens", "kv_resident_request_ids", *TENANT_COLUMNS)
# steps.csv's columns (without tenants), in order: ``step_row``'s keys
STEP_CSV_COLUMNS = (
    *(f.name for f in fields(StepRecord) if f.name not in STEP_CSV_SKIPPED),
    *("num_kv_requests", "kv_resident_tokens", "kv_cache_usage"),
)


def step_row(rec: StepRecord) -> dict[str, Any]:
    """The steps.csv row: resident tokens summed, KV usage added, per-tenant counts as columns of
    their own (kvplan.results.stats.shed.tenant_step_cells)."""
    row = {f.name: getattr(rec, f.name) for f in fields(rec) if f.name not in STEP_CSV_SKIPPED}
    row.update(tenant_step_cells(rec))
    row["num_kv_requests"] = len(rec.kv_resident_tokens)
    row["kv_resident_tokens"] = sum(rec.kv_resident_tokens)
    row["kv_cache_usage"] = metrics.kv_cache_usage(rec)
    return row


def step_columns(steps: Sequence[StepRecord]) -> dict[str, list]:
    """steps.csv's columns for steps without tenants: ``step_row``'s keys in its order, each
    column read in one pass (no dict per step)."""
    columns: dict[str, list] = {
        f.name: record_column(steps, f.name) for f in fields(StepRecord) if f.name not in STEP_CSV_SKIPPED
    }
    resident = record_column(steps, "kv_resident_tokens")
    columns["num_kv_requests"] = list(map(len, resident))
    columns["kv_resident_tokens"] = list(map(sum, resident))
    # metrics.kv_cache_usage of each step
    used, total = columns["num_used_blocks"], columns["num_total_blocks"]
    columns["kv_cache_usage"] = [u / t if t else 0.0 for u, t in zip(used, total)]
    return columns


def step_frame(steps: Sequence[StepRecord]) -> pd.DataFrame:
    """steps.csv's rows (``step_row``) as a frame; built column by column where no step has tenants
    (``step_columns``), row by row otherwise."""
    import pandas as pd

    if any(record_column(steps, "tenant_ids")):
        return pd.DataFrame([step_row(s) for s in steps])
    return pd.DataFrame(step_columns(steps))


def write_tables(
    run_dir: Path, requests: Sequence[RequestRecord], steps: Sequence[StepRecord], steps_csv: bool = True
) -> None:
    """Atomically write requests.csv and steps.csv (empty tables keep their header; ``steps_csv``
    False: requests.csv only, steps.csv made elsewhere: ``StepsCsvChunks``)."""
    if steps_csv:
        write_steps_csv(run_dir, steps)
    rows = [request_row(r) for r in requests]
    chunks = None
    if rows:  # every row has request_row's keys, in its order; the level column as pandas' object
        chunks = csv_chunks({name: [row[name] for row in rows] for name in rows[0]}, as_object=("level",))
    if chunks is not None:
        write_atomic(run_dir / "requests.csv", chunks)
    else:
        _write_frame(run_dir / "requests.csv", requests, lambda: _frame(rows), RequestRecord)


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(rows)


def write_steps_csv(run_dir: Path, steps: Sequence[StepRecord]) -> None:
    """Atomically write steps.csv: a chunk of rows at a time by ``csv_chunks`` (the bytes pandas
    writes) where no step has tenants, else through pandas."""
    chunks = None
    if steps and not any(record_column(steps, "tenant_ids")):
        # concurrency N stays an integer next to open-loop rates: the level column as pandas' object
        chunks = csv_chunks(step_columns(steps), as_object=("level",))
    if chunks is not None:
        write_atomic(run_dir / "steps.csv", chunks)
    else:
        _write_frame(run_dir / "steps.csv", steps, lambda: step_frame(steps), StepRecord)


def _write_frame(path: Path, rows: Sequence[Any], build: Callable[[], pd.DataFrame], kind: type) -> None:
    import pandas as pd

    frame = build() if rows else pd.DataFrame(columns=[f.name for f in fields(kind)])
    if rows:  # concurrency N stays an integer next to open-loop rates (one column would be float)
        frame["level"] = pd.Series(record_column(rows, "level"), dtype=object)
    per_tenant = [c for c in frame.columns if c.startswith(("running[", "waiting["))]
    frame[per_tenant] = frame[per_tenant].fillna(0).astype(int)  # a tenant absent from a step had none
    write_atomic(path, frame.to_csv(index=False))


def step_csv_rows(steps: StepRows) -> tuple[str | None, str]:
    """(steps.csv's rows of ``steps`` without the header, their columns' type sets: each column's
    type names, sorted, joined by ",", the columns by ";"), by ``csv_chunks`` of ``step_columns``,
    as the whole table's writer makes them where its columns hold these type sets; (None, "-")
    where pandas must build the table (a step has tenants, or a value csv_chunks does not take)."""
    if any(record_column(steps, "tenant_ids")):
        return None, "-"
    columns = step_columns(steps)
    pieces = csv_chunks(columns, as_object=("level",))
    if pieces is None:
        return None, "-"
    rows = "".join(pieces).split("\n", 1)[1]  # without the header
    return rows, ";".join(",".join(sorted(t.__name__ for t in set(map(type, c)))) for c in columns.values())


def _dtype(types: frozenset[str], as_object: bool) -> str:
    """The dtype pandas gives a column of values of these type names (the module docstring)."""
    if as_object or not types <= {"int", "float", "NoneType"} or types == {"NoneType"}:
        return "object"
    return "int64" if types == {"int"} else "float64"


class StepsCsvChunks:
    """steps.csv made a piece of steps at a time while a simulation runs (by the processes that
    write its JSONL lines beside it, kvplan.results.writing.run_writer.LinesBeside), into a temporary file that
    ``finish`` puts in place. Each piece's rows come with its columns' type sets
    (kvplan.results.writing.step_texts), kept in a second file: a piece's text equals the whole
    table's rows where each of its columns was written for the dtype pandas gives the whole column
    (how pandas writes a cell depends on that dtype and on nothing else: the module's docstring),
    from the union of the pieces' type sets; a piece of None alone is empty in any dtype. So
    ``ready`` is False where a piece's dtype differs, where a piece has tenants or a value
    ``csv_chunks`` does not take (type sets ``-``: tables pandas builds), or where a piece is
    missing: steps.csv is then written whole, as without this. The caller gives the pieces in
    order, each once, from step 0 on, and counts them."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.tmp = run_dir / ".steps.csv.chunks.tmp"
        self.types = run_dir / ".steps.csv.types.tmp"

    @contextmanager
    def appending(self) -> Iterator[Callable[[str | None, str, bool], None]]:
        """A function ``put(rows, types, first)`` that appends a piece's rows (``step_texts``'; None:
        none) with the header where ``first`` (the table's first piece), and its type sets, to the
        files held open till the block ends."""
        with open(self.tmp, "a", encoding="utf-8") as rows_file, open(self.types, "a", encoding="utf-8") as kinds:

            def put(rows: str | None, types: str, first: bool) -> None:
                if rows is not None:
                    rows_file.write((",".join(STEP_CSV_COLUMNS) + "\n" if first else "") + rows)
                kinds.write(types + "\n")

            yield put

    def ready(self, pieces: int) -> bool:
        """Whether the ``pieces`` pieces given make steps.csv as the whole table's writer would."""
        try:
            lines = self.types.read_text(encoding="utf-8").splitlines()
        except OSError:
            return False
        if pieces <= 0 or len(lines) != pieces or "-" in lines:
            return False
        sets = [[frozenset(cell.split(",")) for cell in line.split(";")] for line in lines]
        if {len(s) for s in sets} != {len(STEP_CSV_COLUMNS)}:
            return False
        for i, name in enumerate(STEP_CSV_COLUMNS):
            column = [s[i] for s in sets]
            whole = _dtype(frozenset().union(*column), name == "level")
            if any(_dtype(t, name == "level") != whole and t != {"NoneType"} for t in column):
                return False
        return True

    def finish(self) -> None:
        """Put the chunks' table in place as steps.csv (atomically); ``ready`` first."""
        os.replace(self.tmp, self.run_dir / "steps.csv")
        self.types.unlink(missing_ok=True)

    def discard(self) -> None:
        """Remove the temporary files (a table written otherwise)."""
        self.tmp.unlink(missing_ok=True)
        self.types.unlink(missing_ok=True)
