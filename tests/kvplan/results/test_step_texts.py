"""A chunk of kept steps as its steps.jsonl lines and steps.csv rows, from one reading of each column
(kvplan.results.writing.step_texts): the lines are json.dumps of each record; the rows, where the
type sets allow, are those the whole-table writer makes (csv_tables.csv_chunks of step_columns, itself
checked against pandas in test_csv_tables) and pandas' own; pieces of rows put end to end make
pandas' table exactly where StepsCsvChunks.ready says so."""

import json
import math

import pandas as pd
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvplan.results.csv_tables import STEP_CSV_COLUMNS, StepsCsvChunks, step_columns, step_csv_rows
from kvplan.results.records import StepRecord, field_names
from kvplan.results.rows import StepRows
from kvplan.results.run_lines import column_lines
from kvplan.results.writing.step_texts import step_texts

NAMES = field_names(StepRecord)
FLOATS = ("start_time", "end_time")
TUPLES = ("kv_resident_tokens", "kv_resident_request_ids", "tenant_ids", "tenant_num_running", "tenant_num_waiting")

# what a column may hold: the usual (one type, often one value) and the unusual a writer must survive
INTS = st.one_of(st.integers(0, 40_000), st.sampled_from([0, 7, 2**63 - 1, -(2**63)]))
BIG = st.sampled_from([2**63, -(2**63) - 1])
FLOAT = st.one_of(st.floats(0, 1e4), st.sampled_from([0.0, -0.0, 1e-05, 1e16, 0.1 + 0.2]))
ODD_FLOAT = st.sampled_from([math.nan, math.inf])
TEXT = st.sampled_from(["hour", "open", "a b", "b%d", ""])
QUOTED = st.sampled_from(["x,y", 'q"', "a\nb"])  # the csv writer quotes them


def usual(name: str) -> st.SearchStrategy:
    if name in FLOATS:
        return FLOAT
    if name == "kv_resident_tokens":
        return st.lists(st.integers(0, 70_000), max_size=5).map(tuple)
    if name == "kv_resident_request_ids":
        return st.lists(st.sampled_from(["b/0", "b/1", "r%2"]), max_size=3).map(tuple)
    if name in TUPLES:
        return st.just(())
    if name in ("bucket", "mode", "variant"):
        return TEXT
    if name == "level":
        return st.one_of(st.integers(1, 64), FLOAT)
    if name == "num_total_blocks":
        return st.sampled_from([16, 27_803, 0])
    return INTS


def unusual(name: str) -> st.SearchStrategy:
    if name in ("tenant_ids", "tenant_num_running", "tenant_num_waiting"):
        return st.just(("t0",) if name == "tenant_ids" else (1,))
    if name == "kv_resident_tokens":
        return st.sampled_from([(1.5, 2), (True,), (3,)])
    if name in ("num_used_blocks", "num_total_blocks"):  # steps.csv divides them (as any run has them)
        return st.one_of(BIG, st.just(0))
    return st.one_of(st.none(), BIG, ODD_FLOAT, st.booleans(), TEXT, QUOTED, FLOAT, INTS)


@st.composite
def step_columns_drawn(draw):
    """Columns of a few steps: each column of one value or of its usual type, and up to two columns
    with values of other types."""
    rows = draw(st.integers(1, 6))
    odd = draw(st.sets(st.sampled_from(NAMES), max_size=2))
    columns = []
    for name in NAMES:
        kind = "odd" if name in odd else draw(st.sampled_from(["one", "usual", "usual"]))
        if kind == "one":
            columns.append([draw(usual(name))] * rows)
        elif kind == "usual":
            columns.append(draw(st.lists(usual(name), min_size=rows, max_size=rows)))
        else:
            columns.append(draw(st.lists(st.one_of(usual(name), unusual(name)), min_size=rows, max_size=rows)))
    return columns


def _csv_rows_made(columns) -> bool:
    """Whether the rows came from the lines' texts (the fast path), not from csv_chunks."""
    from kvplan.results.run_lines import columns_texts
    from kvplan.results.writing.step_texts import _csv_rows

    made = columns_texts(columns)
    return made is not None and _csv_rows(columns, made, len(columns[0])) is not None


def pandas_rows(steps: StepRows) -> str:
    """pandas' steps.csv of these steps (csv_tables.write_steps_csv's frame), without its header."""
    frame = pd.DataFrame(step_columns(steps))
    frame["level"] = pd.Series(steps.column("level"), dtype=object)
    return frame.to_csv(index=False).split("\n", 1)[1]


@settings(max_examples=400, deadline=None)
@given(step_columns_drawn())
def test_lines_are_json_dumps_and_rows_the_whole_table_writers(columns):
    lines, rows, types = step_texts(columns)
    event("rows from the lines' texts" if _csv_rows_made(columns) else "rows by csv_chunks")
    records = [dict(zip(NAMES, values)) for values in zip(*columns)]
    assert lines == "".join(json.dumps(r) + "\n" for r in records)
    steps = StepRows.of_columns(columns)
    assert (rows, types) == step_csv_rows(steps)
    if rows is not None:
        assert rows == pandas_rows(steps)
    else:  # pandas must build it: a tenant, or a value csv_chunks does not take
        assert any(steps.column("tenant_ids")) or types == "-"


def test_rows_by_hand():
    """Two decode steps of a trace's open level: the lines' texts are the cells (times as repr,
    counts as str, None empty); usage = used / total blocks; resident requests and tokens counted."""
    steps = StepRows.of_columns([[v, w] for v, w in zip(_step(0, 0.1, None), _step(1, 0.25, None))])
    lines, rows, types = step_texts(steps.columns())
    assert _csv_rows_made(steps.columns())
    assert rows == (
        "0,hour,open,1.5,0.1,0.2,0,2,2,0,3,13,16,0,0,0,0,0,0,0,0,0,,,2,0,0,0,0,0,0,0,0,0,0,0,0,0,2,70,0.1875\n"
        "1,hour,open,1.5,0.25,0.35,0,2,2,0,3,13,16,0,0,0,0,0,0,0,0,0,,,2,0,0,0,0,0,0,0,0,0,0,0,0,0,2,70,0.1875\n"
    )
    assert types.split(";")[STEP_CSV_COLUMNS.index("num_peak_used_blocks")] == "NoneType"
    assert types.split(";")[STEP_CSV_COLUMNS.index("kv_cache_usage")] == "float"
    assert lines.splitlines()[1].startswith('{"step_index": 1, "bucket": "hour", "mode": "open", "level": 1.5,')


def _step(i: int, start: float, peak: int | None) -> list:
    values = dict.fromkeys(NAMES, 0)
    values.update(step_index=i, bucket="hour", mode="open", level=1.5, start_time=start, end_time=start + 0.1)
    values.update(num_decode_tokens=2, num_running=2, num_used_blocks=3, num_free_blocks=13, num_total_blocks=16)
    values.update(kv_resident_tokens=(30, 40), kv_resident_request_ids=("a", "b"), variant=None)
    values.update(num_peak_used_blocks=peak, num_prefill_seqs=2, tenant_ids=(), tenant_num_running=())
    values.update(tenant_num_waiting=())
    return [values[n] for n in NAMES]


def _table(tmp_path, pieces: list[StepRows]) -> tuple[bool, str]:
    """The pieces put end to end by StepsCsvChunks: whether it is ready, and its text."""
    tmp_path.mkdir()
    chunks = StepsCsvChunks(tmp_path)
    with chunks.appending() as put:
        for i, piece in enumerate(pieces):
            _, rows, types = step_texts(piece.columns())
            put(rows, types, i == 0)
    ready = chunks.ready(len(pieces))
    if ready:
        chunks.finish()
    return ready, (tmp_path / "steps.csv").read_text() if ready else ""


def test_pieces_of_other_types_make_the_table_where_the_dtype_is_the_whole_columns(tmp_path):
    """A column None in one piece and an int in another is float64 in the whole table (the int
    written 5.0): the int piece was written for int64, so not ready. None in one piece and floats in
    another (a time): ready, and pandas' table. The level as 2 in one piece and 1.5 in another (an object
    column, each by str): ready."""
    whole = lambda pieces: pandas_rows(StepRows.of_columns([sum(c, []) for c in zip(*(p.columns() for p in pieces))]))  # noqa: E731
    header = ",".join(STEP_CSV_COLUMNS) + "\n"
    none_int = [_rows(_step(0, 0.1, None)), _rows(_step(1, 0.2, 5))]
    assert _table(tmp_path / "a", none_int) == (False, "")
    none_float = [_rows(_step(0, 0.1, None)), _rows(_with(_step(1, 0.2, None), "start_time", None))]
    assert _table(tmp_path / "b", none_float) == (True, header + whole(none_float))
    levels = [_rows(_with(_step(0, 0.1, 3), "level", 2)), _rows(_step(1, 0.2, 4))]
    assert _table(tmp_path / "c", levels) == (True, header + whole(levels))
    assert "\n0,hour,open,2,0.1," in "\n" + _table(tmp_path / "d", levels)[1]
    usage = [_rows(_with(_step(0, 0.1, 3), "num_total_blocks", 0)), _rows(_step(1, 0.2, 4))]
    assert _table(tmp_path / "e", usage) == (True, header + whole(usage))
    assert _table(tmp_path / "f", [_rows(_with(_step(0, 0.1, 3), "tenant_ids", ("t",)))]) == (False, "")


def _rows(values: list) -> StepRows:
    return StepRows([tuple(values)])


def _with(values: list, name: str, value) -> list:
    values = list(values)
    values[NAMES.index(name)] = value
    return values


def test_ready_by_dtype():
    """Each piece's type sets against the union's dtype (pandas: int64, float64, object)."""
    import tempfile
    from pathlib import Path

    def ready(*lines: list[str]) -> bool:
        with tempfile.TemporaryDirectory() as tmp:
            chunks = StepsCsvChunks(Path(tmp))
            with chunks.appending() as put:
                for cells in lines:
                    base = ["int"] * len(STEP_CSV_COLUMNS)
                    for name, kind in cells:
                        base[STEP_CSV_COLUMNS.index(name)] = kind
                    put("", ";".join(base), False)
            return chunks.ready(len(lines))

    assert ready([], [])
    assert not ready([("num_running", "int")], [("num_running", "float")])
    assert ready([("num_running", "NoneType")], [("num_running", "float")])
    assert ready([("num_running", "NoneType")], [("num_running", "NoneType")])
    assert not ready([("num_running", "NoneType")], [("num_running", "int")])
    assert ready([("num_running", "float,int")], [("num_running", "float")])
    assert ready([("level", "int")], [("level", "float")], [("level", "str")])
    assert not ready([("bucket", "str")], [("bucket", "int")])
    with tempfile.TemporaryDirectory() as tmp:
        chunks = StepsCsvChunks(Path(tmp))
        with chunks.appending() as put:
            put(None, "-", True)
        assert not chunks.ready(1)
        assert not chunks.ready(2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-(2**70), 2**70), max_size=6).map(tuple), min_size=1, max_size=8))
def test_int_tuples_are_json_dumps(column):
    """A column of int tuples (empty, of one, of big and negative ints) from their reprs: json's text."""
    assert column_lines(["t"], [column]) == [json.dumps({"t": t}) + "\n" for t in column]
