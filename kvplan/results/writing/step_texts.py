"""A chunk of a simulation's kept steps as its steps.jsonl lines and its steps.csv rows, both made
from one reading of each column.

A 20,000-request trace keeps 1.3 million steps (docs/benchmarks.md#trace-20k). Its lines are made a
column at a time (kvplan.results.run_lines.column_texts: each column's one type, and each value's
JSON text, once). steps.csv holds most of the same fields, and where a column holds one type its
cells are the same texts: an int's ``str`` is its JSON text, a finite float's ``repr`` (what pandas
writes of a float64 cell) is its JSON text, a column of None is empty. So the rows take those
texts, and only the columns the table adds are computed (``csv_tables.step_columns``: the resident
requests and tokens, the KV cache usage). Where a column is not of one such type (the lines are
made one by one then, kvplan.results.store.RecordLines), or a string needs the csv writer's quotes,
or an int is beyond int64, or a step has tenants, the rows are ``csv_tables.step_csv_rows``'.
Either way the rows come with their columns' type sets, which ``StepsCsvChunks.ready`` checks
against the whole table's (pandas formats a column by the dtype of the whole column).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import truediv
from typing import Any

from kvplan.results.csv_tables import STEP_CSV_SKIPPED, step_csv_rows, unquoted
from kvplan.results.records import StepRecord, field_names
from kvplan.results.rows import StepRows
from kvplan.results.run_lines import ColumnTexts, columns_texts, lines_of
from kvplan.results.store import RecordLines

_NAMES = field_names(StepRecord)
_AT = {name: i for i, name in enumerate(_NAMES)}
_CSV = [i for i, name in enumerate(_NAMES) if name not in STEP_CSV_SKIPPED]  # in steps.csv as they are
_INT64 = (-(2**63), 2**63 - 1)


def step_texts(columns: Sequence[Sequence[Any]]) -> tuple[str, str | None, str]:
    """(the steps.jsonl lines, the steps.csv rows, their columns' type sets) of the steps whose
    StepRecord fields hold ``columns`` (one per field, in field order, all as long, at least one
    step): the lines are ``json.dumps`` of each record's fields (RecordLines' bytes), the rows
    pandas' ``to_csv`` of ``csv_tables.step_columns`` without the header, where the whole table's
    columns hold these type sets (``StepsCsvChunks.ready``); rows None (type sets "-") where
    pandas must build the table: a step has tenants, or a value ``csv_tables.csv_chunks`` does not
    take."""
    made = columns_texts(columns)
    rows = len(columns[0])
    if made is None:
        lines = "".join(map(RecordLines(StepRecord).line_of, zip(*columns)))
    else:
        lines = "".join(lines_of(_NAMES, made, rows))
    csv = None if made is None else _csv_rows(columns, made, rows)
    if csv is not None:
        return lines, *csv
    return lines, *step_csv_rows(StepRows.of_columns(columns))


def _csv_rows(columns: Sequence[Sequence[Any]], made: Sequence[ColumnTexts], rows: int) -> tuple[str, str] | None:
    """steps.csv's rows and type sets from the columns' JSON texts, or None where a cell's text is
    not its JSON text (see the module docstring) or a step has tenants."""
    if any(columns[_AT["tenant_ids"]]):
        return None
    cells, moving, kinds = [], [], []
    for i in _CSV:
        kind, fixed, texts = made[i]
        column = columns[i]
        if kind is float:  # finite (column_texts): the repr, as json
            cell = fixed
        elif kind is int:
            low, high = (column[0], column[0]) if texts is None else (min(column), max(column))
            if low < _INT64[0] or high > _INT64[1]:
                return None
            cell = fixed
        elif kind is type(None):
            cell = ""
        elif kind is str:  # the value itself, where the csv writer writes it unquoted
            if not all(map(unquoted, {column[0]} if texts is None else set(column))):
                return None
            cell, texts = (column[0], None) if texts is None else ("", column)
        else:
            return None
        kinds.append(kind.__name__)
        if texts is None:
            cells.append(cell.replace("%", "%%"))
        else:
            cells.append(cell or "%s")
            moving.append(texts)
    derived = _derived(columns, made)
    if derived is None:
        return None
    for cell, texts, kind in derived:
        kinds.append(kind)
        cells.append(cell)
        moving.append(texts)
    template = ",".join(cells) + "\n"
    text = "".join(map(template.__mod__, zip(*moving))) if moving else template * rows
    return text, ";".join(kinds)


def _derived(columns: Sequence[Sequence[Any]], made: Sequence[ColumnTexts]) -> list[tuple] | None:
    """steps.csv's added columns (``csv_tables.step_columns``): each as (its %-format, its values or
    texts, its type's name): the resident requests and their tokens (ints), the KV cache usage
    (used / total blocks, a float; 0.0 with no blocks); None where they are not of those types."""
    resident = columns[_AT["kv_resident_tokens"]]
    tokens = list(map(sum, resident))
    if set(map(type, tokens)) != {int} or made[_AT["num_used_blocks"]][0] is not int:
        return None
    if made[_AT["num_total_blocks"]][0] is not int:
        return None
    used, total = columns[_AT["num_used_blocks"]], columns[_AT["num_total_blocks"]]
    if 0 in total:
        usage = [u / t if t else 0.0 for u, t in zip(used, total)]
    else:
        usage = list(map(truediv, used, total if made[_AT["num_total_blocks"]][2] else repeat(total[0])))
    distinct = set(usage)
    memo = dict(zip(distinct, map(float.__repr__, distinct)))
    memo.pop(0.0, None)  # 0.0 and -0.0: equal, written apart
    texts = list(map(memo.get, usage))
    if None in texts:
        texts = [float.__repr__(v) if t is None else t for t, v in zip(texts, usage)]
    return [("%d", list(map(len, resident)), "int"), ("%d", tokens, "int"), ("%s", texts, "float")]
