"""The run folder's JSONL lines written fast are json.dumps' own lines (kvplan.results.store.RecordLines),
a step record built by ``StepRecord.from_stats`` is the record its constructor builds, and a record
field read as a column is the field read record by record (kvplan.results.records.column)."""

import json
import math
import pickle
from dataclasses import fields

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvplan.results.records import LevelKey, RequestRecord, StepRecord, field_names, request_record, step_values
from kvplan.results.rows import StepRows, by_level, column, pick
from kvplan.results.store import RecordLines
from kvplan.results.writing.run_writer import RunWriter

# what json.dumps wrote for each record, one line: the contract the files have always kept
dumps_line = lambda r: json.dumps({n: getattr(r, n) for n in field_names(type(r))}) + "\n"  # noqa: E731

floats = st.floats(allow_nan=True, allow_infinity=True)
texts = st.text(max_size=12)  # any code point: non-ASCII, quotes, backslashes, % signs, controls
value = st.one_of(
    st.none(),
    st.integers(min_value=-(2**70), max_value=2**70),
    floats,
    texts,
    st.tuples(),
    st.lists(st.integers(-(10**6), 10**12), max_size=6).map(tuple),
    st.lists(texts, max_size=4).map(tuple),
    st.lists(floats, max_size=4).map(tuple),
)


def _record(record_type, values):
    names = field_names(record_type)
    return record_type(**dict(zip(names, values)))


@settings(max_examples=300)
@given(
    st.sampled_from([StepRecord, RequestRecord]).flatmap(
        lambda t: st.tuples(st.just(t), st.lists(value, min_size=len(fields(t)), max_size=len(fields(t))))
    )
)
@example((StepRecord, [1.5, "a%d%%s", None, float("nan"), *[0] * (len(fields(StepRecord)) - 4)]))
def test_a_line_is_json_dumps_line(case):
    record_type, values = case
    record = _record(record_type, values)
    lines = RecordLines(record_type)
    assert lines.line(record) == dumps_line(record)
    assert lines.line(record) == dumps_line(record)  # twice: the template and the array kept from the first


def test_other_types_and_shared_arrays_are_json_dumps_lines():
    lines = RecordLines(StepRecord)
    base = StepRecord(**{f.name: 0 for f in fields(StepRecord)})
    ids = ("hour/open/1.5/0", "hour/open/1.5/1")
    for changes in (
        {"kv_resident_request_ids": ids, "kv_resident_tokens": (3, 4)},
        {"kv_resident_request_ids": ids, "kv_resident_tokens": (4, 5)},  # the same ids object: encoded once
        {"kv_resident_request_ids": ("x",), "start_time": np.float64(0.1)},  # a numpy float: json.dumps' line
        {"level": True, "num_running": np.int64(3)},  # a bool and a numpy int: json.dumps' line (raises)
        {"start_time": -math.inf, "end_time": 1e300, "bucket": 'é"\\\n'},
        {"num_peak_used_blocks": None, "level": 2.0},
    ):
        record = StepRecord(**{**base.__dict__, **changes})
        try:
            expected = dumps_line(record)
        except TypeError:
            with pytest.raises(TypeError):
                lines.line(record)
            continue
        assert lines.line(record) == expected


def test_a_chunked_writer_writes_every_line_in_order(tmp_path):
    base = StepRecord(**{f.name: 0 for f in fields(StepRecord)})
    steps = [StepRecord(**{**base.__dict__, "step_index": i, "start_time": i / 7}) for i in range(5000)]
    with RunWriter(tmp_path, flush=False) as writer:
        for s in steps:
            writer.write_step(s)
        assert (tmp_path / "steps.jsonl").read_text().count("\n") == 4096  # two chunks of 2048 so far
    assert (tmp_path / "steps.jsonl").read_text() == "".join(map(dumps_line, steps))


def test_from_stats_is_the_constructor_record():
    stats = StepRecord(**{f.name: i for i, f in enumerate(fields(StepRecord))})
    key = LevelKey("b", "open", 2.5, "cached")
    sizes = {"ideal_bytes": 10, "paged_bytes": 20, "contiguous_bytes": 30, "measured_bytes": 40}
    built = StepRecord.from_stats(key, stats, **sizes)
    own = {"bucket": "b", "mode": "open", "level": 2.5, "variant": "cached", **sizes}
    expected = StepRecord(**{f.name: own.get(f.name, getattr(stats, f.name)) for f in fields(StepRecord)})
    assert built == expected and repr(built) == repr(expected) and list(built.__dict__) == list(expected.__dict__)
    with pytest.raises(AttributeError):
        StepRecord.from_stats(key, object(), **sizes)
    with pytest.raises(AttributeError):  # frozen as ever
        built.step_index = 3  # type: ignore[misc]
    assert step_values(key, stats, sizes) == tuple(getattr(expected, f.name) for f in fields(StepRecord))


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_request_record_is_the_constructor_record(data):
    """``request_record`` (the load driver's, kvplan.run.driver.Recorder) equals the dataclass's own
    constructor on any subset of the optional fields; a Finished's fields are all RequestRecord's,
    so its __dict__ can be handed over whole."""
    from dataclasses import MISSING, asdict

    from kvplan.run.driver import Finished

    every = fields(RequestRecord)
    required = {f.name: i for i, f in enumerate(every) if f.default is MISSING}
    optional = [f.name for f in every if f.default is not MISSING]
    given_optional = data.draw(st.lists(st.sampled_from(optional), unique=True))
    values = {
        **required,
        **{name: data.draw(st.one_of(st.none(), st.integers(), st.text(max_size=3))) for name in given_optional},
    }
    built, expected = request_record(values), RequestRecord(**values)
    assert built == expected and repr(built) == repr(expected) and asdict(built) == asdict(expected)
    assert pickle.loads(pickle.dumps(built)) == expected and hash(built.key) == hash(expected.key)
    with pytest.raises(AttributeError):  # frozen as ever
        built.request_id = "x"  # type: ignore[misc]
    assert {f.name for f in fields(Finished)} <= {f.name for f in every}


def test_a_column_is_the_field_of_each_record():
    steps = [StepRecord(**{f.name: i * 100 + j for j, f in enumerate(fields(StepRecord))}) for i in range(3)]
    assert column(steps, "num_waiting") == [s.num_waiting for s in steps]
    mixed = [*steps, object()]
    assert column(mixed, "ideal_bytes", 0) == [s.ideal_bytes for s in steps] + [0]
    with pytest.raises(AttributeError):
        column(mixed, "ideal_bytes")
    assert column([], "ideal_bytes") == []


def _steps(n, level=lambda i: 1.5):
    return [
        StepRecord(
            **{
                **{f.name: i * 100 + j for j, f in enumerate(fields(StepRecord))},
                **{"level": level(i), "bucket": "b", "mode": "open", "variant": ""},
            }
        )
        for i in range(n)
    ]


def test_step_rows_are_the_records_they_hold():
    steps = _steps(5)
    rows = StepRows()
    for s in steps:
        rows.append_values(tuple(getattr(s, f.name) for f in fields(StepRecord)))
    assert len(rows) == 5 and list(rows) == steps and rows[3] == steps[3] and rows[-1] == steps[-1]
    assert rows == steps and rows[1:3] == StepRows(rows.rows[1:3]) == steps[1:3]
    assert repr(rows[2]) == repr(steps[2]) and list(rows[2].__dict__) == [f.name for f in fields(StepRecord)]
    for name in ("num_waiting", "kv_resident_tokens", "level"):
        assert column(rows, name) == column(steps, name) == [getattr(s, name) for s in steps]
    with pytest.raises(AttributeError):
        column(rows, "no_such_field")
    assert column(rows, "no_such_field", 7) == [7] * 5


def test_one_level_groups_as_the_loop_groups_it():
    """A run of one level (a trace's replay: a million steps) is read in one pass per level field;
    its group is what grouping step by step gives, 1 and 1.0 one level as their LevelKeys are."""
    for level in (lambda i: 2.5, lambda i: [1, 1.0][i % 2]):
        steps = _steps(5, level=level)
        rows = StepRows([tuple(getattr(s, f.name) for f in fields(StepRecord)) for s in steps])
        positions = by_level(rows)
        key = (steps[0].bucket, steps[0].mode, level(0), steps[0].variant)
        assert positions == by_level(steps) == {key: [0, 1, 2, 3, 4]}
        assert [type(k[2]) for k in positions] == [type(level(0))]  # the first step's value, as the loop keeps it
        assert pick(rows, positions[next(iter(positions))]) is rows
    assert by_level(StepRows()) == {} == by_level([])


def test_levels_group_as_their_keys():
    steps = _steps(6, level=lambda i: [1, 2.5, 1.0, 3][i % 4])  # 1 and 1.0: one LevelKey, as before
    rows = StepRows([tuple(getattr(s, f.name) for f in fields(StepRecord)) for s in steps])
    for records in (steps, rows):
        positions = by_level(records)
        assert [LevelKey(*level) for level in positions] == list(dict.fromkeys(s.key for s in steps))
        assert list(positions.values()) == [[0, 2, 4], [1, 5], [3]]
        assert list(pick(records, positions[(steps[1].bucket, steps[1].mode, 2.5, steps[1].variant)])) == [
            steps[1],
            steps[5],
        ]
