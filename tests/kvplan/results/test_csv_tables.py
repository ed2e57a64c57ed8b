"""steps.csv without pandas (kvplan.results.csv_tables.csv_chunks): the same bytes as pandas'
``DataFrame(columns).to_csv(index=False)`` for columns of any mix of ints, floats (NaN, inf,
subnormal, huge), None, bools and strings needing quotes; pandas itself is the reference."""

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.results.csv_tables import csv_chunks, step_frame, write_tables
from kvplan.results.records import LevelKey, StepRecord, step_values
from kvplan.results.rows import StepRows

VALUES = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.text(alphabet=st.sampled_from('ab,"\n\r x'), max_size=4),
)
KINDS = st.sampled_from(["int", "float", "int|none", "float|none", "any", "text", "int", "float"])


@st.composite
def columns(draw):
    rows = draw(st.integers(min_value=1, max_value=9))
    cols = {}
    for i in range(draw(st.integers(min_value=2, max_value=5))):
        kind = draw(KINDS)
        elem = {
            "int": st.integers(min_value=-(2**63), max_value=2**63 - 1),
            "float": st.floats(),
            "int|none": st.one_of(st.integers(-(10**6), 10**6), st.none()),
            "float|none": st.one_of(st.floats(), st.integers(-5, 5), st.none()),
            "any": VALUES,
            "text": st.text(alphabet=st.sampled_from('ab,"\n\r x%'), max_size=3),  # one type: a row by %
        }[kind]
        cols[f"c{i}"] = draw(st.lists(elem, min_size=rows, max_size=rows))
    return cols


def pandas_text(cols, as_object=()):
    frame = pd.DataFrame(cols)
    for name in as_object:
        frame[name] = pd.Series(cols[name], dtype=object)
    return frame.to_csv(index=False)


@settings(max_examples=400, deadline=None)
@given(columns(), st.integers(min_value=1, max_value=4), st.booleans())
def test_same_bytes_as_pandas(cols, chunk_rows, first_as_object):
    as_object = ("c0",) if first_as_object else ()
    chunks = csv_chunks(cols, as_object=as_object, chunk_rows=chunk_rows)
    assert chunks is not None
    assert "".join(chunks) == pandas_text(cols, as_object)


def test_by_hand_and_refusals():
    text = "".join(csv_chunks({"a": [1, None], "b": [0.5, math.nan], "c": ["x,y", None], "d": [1, 2.5]}))
    assert text == 'a,b,c,d\n1.0,0.5,"x,y",1.0\n,,,2.5\n'
    assert csv_chunks({"a": [(1,)], "b": [1]}) is None  # a tuple: pandas builds it
    assert csv_chunks({"a": [2**63], "b": [1]}) is None  # beyond int64
    with pytest.raises(ValueError):
        csv_chunks({"a": [1]})


def step(i, level, peak):
    stats = StepRecord(
        i,
        "b",
        "open",
        level,
        i * 0.1,
        i * 0.1 + 0.03,
        3,
        2,
        2,
        0,
        7,
        9,
        16,
        0,
        1,
        0,
        5,
        2,
        (12, 40),
        0,
        0,
        0,
        0,
        num_peak_used_blocks=peak,
    )
    return step_values(
        LevelKey("b", "open" if isinstance(level, float) else "closed", level),
        stats,
        {"ideal_bytes": 10 * i, "paged_bytes": 3, "contiguous_bytes": 0, "measured_bytes": 7},
    )


def test_steps_csv_as_pandas_wrote_it(tmp_path):
    """A run's steps.csv written by csv_chunks equals the frame pandas wrote (levels 4 and 2.5 in one
    column stay 4 and 2.5; a None peak makes that column float)."""
    steps = StepRows([step(0, 4, 9), step(1, 2.5, None), step(2, 4, 11)])
    write_tables(tmp_path, [], steps)
    frame = step_frame(steps)
    frame["level"] = pd.Series([4, 2.5, 4], dtype=object)
    assert (tmp_path / "steps.csv").read_text() == frame.to_csv(index=False)
    assert (tmp_path / "steps.csv").read_text().splitlines()[2].split(",")[3] == "2.5"


def test_rows_of_one_type_per_column_are_written_by_template():
    """Columns of ints, floats and plain strings take the %-template (csv_tables._row_template);
    a string the writer quotes, or a None, does not; the bytes are pandas' either way."""
    from kvplan.results.csv_tables import _row_template

    cols = {"a": [1, -(2**63)], "b": [0.5, 1e20], "c": ["x", "a b"], "d": [1e-5, math.inf]}
    assert _row_template(list(cols.values())) == "%d,%r,%s,%r\n"
    assert (
        "".join(csv_chunks(cols, chunk_rows=1))
        == pandas_text(cols)
        == "a,b,c,d\n1,0.5,x,1e-05\n-9223372036854775808,1e+20,a b,inf\n"
    )
    assert _row_template([["x,y"], [1]]) is None and _row_template([[None], [1]]) is None
    quoted = {"a": ['x"y', "z"], "b": [1, 2]}
    assert "".join(csv_chunks(quoted)) == pandas_text(quoted)


POOL = st.sampled_from([0.0, -0.0, 0.5, 1e-05, 3.0, 1e20, 5e-324, math.inf, -math.inf, 0.1 + 0.2])


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.lists(st.lists(POOL, min_size=n, max_size=n), min_size=2, max_size=4)))
def test_float_columns_of_repeated_values_are_pandas_bytes(values):
    """Float columns whose values repeat within and across columns (a step's start, the step
    before's end), 0.0 and -0.0 among them: each repr made once, the bytes pandas writes."""
    cols = {f"c{i}": column for i, column in enumerate(values)}
    assert "".join(csv_chunks(cols, as_object=("c0",), chunk_rows=5)) == pandas_text(cols, ("c0",))


CELLS = st.sampled_from(
    [
        st.sampled_from([0, 7, -1, 2**63 - 1]),
        st.sampled_from(["a", "b%d", "%%", "x y"]),
        POOL,
        st.just(3),
        st.just("%s"),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(2, 12).flatmap(
        lambda n: st.lists(CELLS.flatmap(lambda c: st.lists(c, min_size=n, max_size=n)), min_size=2, max_size=6)
    ),
    st.integers(1, 5),
)
def test_columns_fixed_over_a_chunk_are_pandas_bytes(values, chunk_rows):
    """Int and str columns that hold one value over a chunk (written into its template, a % in a
    string doubled there), beside moving ones, and chunks where every column is fixed: pandas' bytes."""
    cols = {f"c{i}": column for i, column in enumerate(values)}
    assert "".join(csv_chunks(cols, chunk_rows=chunk_rows)) == pandas_text(cols)


OPTIONAL_TIME = st.one_of(st.none(), st.floats(0, 1e4))


@st.composite
def request_records(draw):
    """Requests of every kind a run writes: finished, rejected (no latency), aborted before a
    token; levels as concurrencies and rates; fields set in some rows only."""
    from kvplan.results.records import RequestRecord

    records = []
    for i in range(draw(st.integers(1, 6))):
        arrival = draw(st.floats(0, 100))
        times = tuple(sorted(draw(st.lists(st.floats(arrival, arrival + 50), max_size=4))))
        records.append(
            RequestRecord(
                request_id=draw(st.sampled_from([f"r{i}", f"a,b{i}", f'q"{i}'])),
                bucket=draw(st.sampled_from(["short", "long doc"])),
                mode=draw(st.sampled_from(["closed", "open"])),
                level=draw(st.sampled_from([4, 2.5, 1, 0.1 + 0.2])),
                arrival_time=arrival,
                first_scheduled_time=draw(OPTIONAL_TIME),
                finish_time=arrival + 60,
                token_times=times,
                num_prompt_tokens=draw(st.integers(1, 9000)),
                num_output_tokens=len(times),
                max_tokens=draw(st.integers(1, 9000)),
                finish_reason=draw(st.sampled_from(["stop", "length", "rejected", "abort", "error"])),
                finish_detail=draw(st.sampled_from(["", "HTTP 500: boom, again"])),
                num_preemptions=draw(st.integers(0, 3)),
                prefix_group=draw(st.one_of(st.none(), st.integers(0, 4))),
                tenant=draw(st.one_of(st.none(), st.integers(0, 2))),
                cache_salt=draw(st.one_of(st.none(), st.just("t1"))),
                sent_time=draw(OPTIONAL_TIME),
                session=draw(st.one_of(st.none(), st.integers(0, 3))),
                turn=draw(st.one_of(st.none(), st.integers(1, 3))),
                first_output_time=draw(OPTIONAL_TIME),
                tenant_name=draw(st.one_of(st.none(), st.just("gold"))),
                kv_transfer_s=draw(OPTIONAL_TIME),
            )
        )
    return records


@settings(max_examples=150, deadline=None)
@given(request_records())
def test_requests_csv_as_pandas_wrote_it(tmp_path_factory, records):
    """requests.csv written by csv_chunks (no pandas) equals what pandas wrote of the same rows:
    ``DataFrame(rows)`` with the level column as object (kvplan.results.csv_tables.write_tables)."""
    from kvplan.results.csv_tables import request_row

    folder = tmp_path_factory.mktemp("requests")
    rows = [request_row(r) for r in records]
    assert csv_chunks({k: [row[k] for row in rows] for k in rows[0]}, as_object=("level",)) is not None  # not pandas
    write_tables(folder, records, [], steps_csv=False)
    frame = pd.DataFrame([request_row(r) for r in records])
    frame["level"] = pd.Series([r.level for r in records], dtype=object)
    assert (folder / "requests.csv").read_text() == frame.to_csv(index=False)
