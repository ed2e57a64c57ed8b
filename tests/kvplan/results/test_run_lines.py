"""A decode run's step records made at once (kvplan.results.run_lines, RunWriter.write_decode_run,
KVPricing.run_bytes) are the records made step by step: the same values (as columns), the same
JSON lines as json.dumps writes them, the same KV sizes as ``step_bytes`` of each step; and step
records held as columns (kvplan.results.rows.StepRows) read as the records they hold."""

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.outputs import DecodeRunSteps
from kvplan.results.records import LevelKey, StepRecord, field_names, step_values
from kvplan.results.run_lines import FloatTexts, decode_run_records, float_texts, grown_blocks
from kvplan.results.store import KeptRecords
from kvplan.results.writing.run_writer import RunWriter
from kvplan.run.estimate import KVPricing

dumps_line = lambda r: json.dumps({n: getattr(r, n) for n in field_names(type(r))}) + "\n"  # noqa: E731


@st.composite
def runs(draw):
    """A DecodeRunSteps as engine.decode_run makes one: k steps of n decodes, blocks taken at
    ascending steps, columns (admission's tenants, offload's tier sizes) fixed over the run."""
    k = draw(st.integers(1, 40))
    n = draw(st.integers(1, 12))
    computed = draw(st.lists(st.integers(1, 5000), min_size=n, max_size=n))
    first = draw(st.integers(0, 10**6))
    start0 = draw(st.floats(0, 1e5, allow_nan=False) | st.sampled_from([0.0, -0.0]))
    gaps = draw(st.lists(st.floats(1e-6, 0.5, allow_nan=False) | st.just(0.0), min_size=2 * k, max_size=2 * k))
    times = [start0]
    for gap in gaps:
        times.append(times[-1] + gap)
    starts, ends = times[0::2][:k], times[1::2][:k]
    if draw(st.booleans()):  # back to back, as the engine's decode runs are: step j + 1 starts at step j's end
        ends = times[1 : k + 1]
        starts = [start0, *ends[:-1]]
    taken = sorted(draw(st.lists(st.integers(0, k - 1), max_size=3 * n)))
    used = draw(st.integers(0, 10**5))
    free = len(taken) + draw(st.integers(0, 10**5))
    waiting = draw(st.integers(0, 50))
    columns = draw(
        st.sampled_from(
            [
                {},
                {"tenant_ids": ("a", 'b"%'), "tenant_num_running": (2, 1), "tenant_num_waiting": (0, 3)},
                {"num_host_blocks": 7, "num_disk_blocks": 3},
            ]
        )
    )
    ids = tuple(f"hour/open/0.5/{i}" for i in range(n))
    return DecodeRunSteps(first, starts, ends, computed, ids, (waiting, used, free, used + free + 9), taken, columns)


keys = st.sampled_from(
    [LevelKey("hour", "open", 0.5), LevelKey("b%s", "closed", 8, "cached"), LevelKey("é", "open", math.inf)]
)
pricings = st.builds(
    KVPricing, st.integers(1, 2**17), st.sampled_from([1, 2, 16, 64]), st.integers(1, 2**17), st.integers(1, 2**24)
)


@settings(max_examples=300)
@given(runs(), keys, pricings)
def test_a_run_at_once_is_its_steps_one_by_one(run, key, pricing):
    sizes = pricing.run_bytes(run)
    assert [dict(zip(sizes, values)) for values in zip(*sizes.values())] == [pricing.step_bytes(s) for s in run]
    assert grown_blocks(run) == [run.used_blocks(j) - run.used for j in range(len(run))]
    made = decode_run_records(key, run, sizes)
    assert made is not None
    columns, lines = made
    rows = list(zip(*columns))
    expected = [step_values(key, s, pricing.step_bytes(s)) for s in run]
    assert rows == expected
    assert [tuple(map(type, r)) for r in rows] == [tuple(map(type, r)) for r in expected]
    assert lines == [dumps_line(StepRecord(*values)) for values in expected]


def test_a_value_json_does_not_write_as_the_template_would_takes_the_step_path(tmp_path):
    """A time that is not a float, or not finite, gives None; the writer then writes step by step
    and its file holds json.dumps' lines all the same (Infinity included)."""
    pricing = KVPricing(2, 4, 64, 8)
    key = LevelKey("hour", "open", 1.0)
    for starts in ([0.0, math.inf], [0, 1.0]):
        run = DecodeRunSteps(3, starts, [0.5, 1.5], [5, 8], ("a", "b"), (0, 4, 6, 10), [1], {})
        assert decode_run_records(key, run, pricing.run_bytes(run)) is None
        kept = KeptRecords()
        folder = tmp_path / str(starts[0])
        with RunWriter(folder, flush=False, kept=kept) as writer:
            writer.write_decode_run(key, run, pricing.run_bytes(run))
        expected = [step_values(key, s, pricing.step_bytes(s)) for s in run]
        assert kept.steps.rows == expected
        written = (folder / "steps.jsonl").read_text()
        assert written == "".join(dumps_line(StepRecord(*v)) for v in expected)
        assert "Infinity" in written or starts[0] == 0


def test_the_writer_writes_a_run_as_its_steps(tmp_path):
    """RunWriter.write_decode_run against write_step_stats of each step, flushed and chunked: the
    same file and the same kept rows. By hand for one step: 2 requests with 5 and 8 tokens computed,
    block size 4, 2 bytes a token: step 1 holds 7 and 10 tokens: ideal 34, paged (2 + 3) x 4 x 2 = 40."""
    pricing = KVPricing(2, 4, 64, 8)
    key = LevelKey("hour", "open", 1.0)
    run = DecodeRunSteps(3, [0.0, 1.0, 2.0], [0.5, 1.5, 2.5], [5, 8], ("a", "b"), (0, 4, 6, 10), [1], {})
    assert run[1].kv_resident_tokens == (7, 10)
    assert pricing.run_bytes(run)["ideal_bytes"][1] == 34 and pricing.run_bytes(run)["paged_bytes"][1] == 40
    for flush in (True, False):
        one, two = KeptRecords(), KeptRecords()
        with RunWriter(tmp_path / f"one{flush}", flush, one) as writer:
            writer.write_decode_run(key, run, pricing.run_bytes(run))
        with RunWriter(tmp_path / f"two{flush}", flush, two) as writer:
            for stats in run:
                writer.write_step_stats(key, stats, pricing.step_bytes(stats))
        assert one.steps.rows == two.steps.rows
        assert (tmp_path / f"one{flush}" / "steps.jsonl").read_bytes() == (
            tmp_path / f"two{flush}" / "steps.jsonl"
        ).read_bytes()


def test_steps_held_as_columns_read_as_their_records():
    """StepRows: built from rows, from columns or both, indexing, slicing, iterating, equality,
    columns, levels and picks give what a list of the same StepRecords gives."""
    from kvplan.results.rows import StepRows, by_level, column, pick

    pricing = KVPricing(2, 4, 64, 8)
    run = DecodeRunSteps(3, [0.0, 1.0, 2.0], [0.5, 1.5, 2.5], [5, 8], ("a", "b"), (0, 4, 6, 10), [1], {})
    keys = (LevelKey("a", "open", 1.0), LevelKey("b", "closed", 2))
    records = [StepRecord(*step_values(k, s, pricing.step_bytes(s))) for k in keys for s in run]
    held = StepRows([step_values(keys[0], s, pricing.step_bytes(s)) for s in run])
    columns, _ = decode_run_records(keys[1], run, pricing.run_bytes(run))
    held.extend_columns(columns)
    assert len(held) == 6 and list(held) == records and held == records
    assert held[4] == records[4] and held[-1] == records[-1] and list(held[1:5]) == records[1:5]
    assert held == StepRows(held.rows) and held != StepRows.of_columns(columns)
    assert held.rows == [tuple(getattr(r, n) for n in field_names(StepRecord)) for r in records]
    assert column(held, "end_time") == [r.end_time for r in records]
    positions = by_level(held)
    assert positions == {("a", "open", 1.0, ""): [0, 1, 2], ("b", "closed", 2, ""): [3, 4, 5]}
    assert list(pick(held, positions[("b", "closed", 2, "")])) == records[3:]
    assert pick(held, [0, 1, 2, 3, 4, 5]) is held and list(pick(held, [5, 0])) == [records[5], records[0]]


finite = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0])


@settings(max_examples=300)
@given(st.lists(st.tuples(finite, finite, st.booleans()), max_size=30))
def test_float_texts_are_the_reprs(steps):
    """Each start and end as repr writes it, where a start equals the step before's end (0.0 and
    -0.0 among them, equal but written apart) or not."""
    ends = [end for _, end, _ in steps]
    starts = [
        ends[j - 1] * (-1.0 if ends[j - 1] == 0 else 1.0) if same and j else start
        for j, (start, _, same) in enumerate(steps)
    ]
    assert float_texts(ends, starts) == ([repr(e) for e in ends], [repr(s) for s in starts])


kept_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0, 1.0])
values = kept_floats | st.sampled_from([math.inf, -math.inf, math.nan, 1, True, 0])


@settings(max_examples=300)
@given(st.lists(st.lists(kept_floats, max_size=20), max_size=6), st.lists(values, min_size=1, max_size=40))
def test_float_texts_give_json_dumps_of_float_arrays(batches, array):
    """A tuple of token times from the kept reprs (a two-value generation, so old reprs are
    dropped and made again) is json.dumps' text; an int, a bool or a value json writes as NaN or
    Infinity gives None (the caller encodes it); a kept 0.0 is never given for -0.0 or 1.0 for 1."""
    texts = FloatTexts()
    texts.GENERATION = 2
    for batch in batches:
        texts.add(batch, [repr(v) for v in batch])
    plain = all(type(v) is float and math.isfinite(v) for v in array)
    got = texts.array(tuple(array))
    assert got == (json.dumps(tuple(array)) if plain else None)


def test_token_times_take_the_decode_runs_end_texts(tmp_path):
    """A request whose token times are a written decode run's ends: its line is json.dumps', its
    times' reprs found among the run's (none made again)."""
    pricing = KVPricing(2, 4, 64, 8)
    key = LevelKey("hour", "open", 1.0)
    run = DecodeRunSteps(0, [0.5, 0.75, 1.0], [0.75, 1.0, 1.25], [3], ("hour/open/1.0/0",), (0, 1, 9, 10), [], {})
    texts = FloatTexts()
    decode_run_records(key, run, pricing.run_bytes(run), texts)
    times = (0.75, 1.0, 1.25)
    assert texts.array(times) == json.dumps(times)
    texts._new = {v: "x" for v in times}  # found, not made: the kept text is what is written
    assert texts.array(times) == "[x, x, x]"
