"""A simulation's JSONL lines made beside it (kvplan.results.writing.run_writer.LinesBeside: forked processes
writing chunks of the kept records while the run goes on) are the lines a writer makes as each
record comes (``flush`` True: RecordLines' and the decode runs' templates, the bytes of json.dumps):
on the random simulated levels of test_decode_runs (hypothesis), with chunks of a few records so
that many chunks are forked; with a chunk's process that fails part-way (its part cut off, the
chunk written again here); and with no fork at all (one core)."""

import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.results.csv_tables import write_steps_csv
from kvplan.results.records import LevelKey
from kvplan.results.run_lines import column_lines
from kvplan.results.store import KeptRecords
from kvplan.results.writing import run_writer
from kvplan.results.writing.run_writer import LinesBeside, RunWriter
from kvplan.run.driver import Level, Recorder, run_level
from kvplan.run.estimate import KVPricing
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.cost import ModelClock
from kvplan.traffic.requests import SampledRequest
from tests.kvplan.run.sim.test_decode_runs import COST, cases, facts


def written(folder, case, beside: bool) -> tuple[bytes, bytes, int, bytes]:
    """steps.jsonl and requests.jsonl of one simulated level, how many steps it kept, and steps.csv
    (made beside where the writer made it, else by ``write_steps_csv`` from the kept steps)."""
    engine, requests, mode, value, plan, lag, admission = case
    level = Level(LevelKey("b", mode, value, ""), 0, tuple(requests), plan)
    backend = SimBackend(engine, ModelClock(COST, lag), admission=admission)
    pricing = KVPricing(3, engine.block_size, engine.max_model_len, 5)
    kept = KeptRecords()
    with RunWriter(folder, flush=not beside, kept=kept) as writer:
        run_level(backend, level, Recorder(writer, level, pricing.step_bytes), seed=0)
    if kept.steps_csv is not None:
        MADE.append(folder)
        kept.steps_csv.finish()
    else:
        write_steps_csv(folder, kept.steps)
    assert sorted(p.name for p in folder.iterdir()) == ["requests.jsonl", "steps.csv", "steps.jsonl"]
    files = (folder / "steps.jsonl").read_bytes(), (folder / "requests.jsonl").read_bytes()
    return *files, len(kept.steps), (folder / "steps.csv").read_bytes()


MADE: list = []  # the folders whose steps.csv was made beside


def long_case():
    """Six requests of 40 output tokens, 3 at a time: some 90 steps, most of them decode runs."""
    requests = [SampledRequest(tuple(range(i, i + 9 + i)), 40, "random") for i in range(6)]
    return (facts(4, 200, 8, 64, True), requests, "closed", 3, None, 0.0, None)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(cases())
def test_lines_made_beside_are_the_lines_made_as_records_come(tmp_path_factory, monkeypatch, case):
    monkeypatch.setattr(LinesBeside, "CHUNK", 3)
    tmp_path = tmp_path_factory.mktemp("beside")
    here, beside = written(tmp_path / "here", case, False), written(tmp_path / "beside", case, True)
    assert beside == here
    assert here[0].count(b"\n") == here[2]


def test_chunks_are_forked_and_land_in_order(tmp_path, monkeypatch):
    """With chunks of 5 records, each chunk's process waited for before the next is due, the
    80-step level (whose decode runs come 20-40 steps at a time) forks a process for more than
    one chunk (counted), and the files equal those written as the records came."""
    monkeypatch.setattr(LinesBeside, "CHUNK", 5)
    real_reap = LinesBeside._reap
    monkeypatch.setattr(LinesBeside, "_reap", lambda self, block: real_reap(self, True))
    forks = []
    real_fork = os.fork

    def fork():
        pid = real_fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(run_writer.os, "fork", fork)
    monkeypatch.setattr(LinesBeside, "__init__", _two_cores(LinesBeside.__init__))
    here, beside = written(tmp_path / "here", long_case(), False), written(tmp_path / "beside", long_case(), True)
    assert beside == here
    assert here[2] >= 80  # by hand: 6 requests x 40 tokens, 3 at a time, from 2 prefill waves on
    assert len(forks) >= 2
    assert MADE[-1] == tmp_path / "beside"  # steps.csv made by the chunks, equal to the whole table's


def test_a_failed_chunk_is_cut_off_and_written_again(tmp_path, monkeypatch):
    """Each forked chunk writes half a line, then fails: its part is cut off and the chunk
    written here; the files are those written as the records came."""
    monkeypatch.setattr(LinesBeside, "CHUNK", 5)
    monkeypatch.setattr(LinesBeside, "__init__", _two_cores(LinesBeside.__init__))
    parent, real_write = os.getpid(), LinesBeside._write

    def failing(self, spans):
        if os.getpid() != parent:
            with open(self.paths[0], "a") as handle:
                handle.write('{"step_index": ')
            with open(tmp_path / "failed", "a") as marker:
                marker.write("x")
            raise OSError("no space left on device")
        real_write(self, spans)

    monkeypatch.setattr(LinesBeside, "_write", failing)
    here, beside = written(tmp_path / "here", long_case(), False), written(tmp_path / "beside", long_case(), True)
    assert beside == here
    assert (tmp_path / "failed").read_text().startswith("x")  # a chunk's process did fail
    assert tmp_path / "beside" not in MADE  # its steps.csv chunk may be torn: written whole instead


@pytest.mark.parametrize("chunk", [1, 7, 65_536])
def test_without_fork_the_chunks_are_written_here(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(LinesBeside, "CHUNK", chunk)
    monkeypatch.setattr(run_writer.os, "fork", _no_fork)

    def one_core(self, run_dir, kept):
        real(self, run_dir, kept)
        assert self.fork is (hasattr(os, "fork") and (os.cpu_count() or 1) >= 2)
        self.fork = False

    real = LinesBeside.__init__
    monkeypatch.setattr(LinesBeside, "__init__", one_core)
    here, beside = written(tmp_path / "here", long_case(), False), written(tmp_path / "beside", long_case(), True)
    assert beside == here
    assert MADE[-1] == tmp_path / "beside"


def _no_fork():
    raise AssertionError("forked on one core")


def _two_cores(init):
    """LinesBeside.__init__ that forks whatever the machine's core count (this machine may have one)."""

    def made(self, run_dir, kept):
        init(self, run_dir, kept)
        self.fork = hasattr(os, "fork")

    return made


values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.5, 1e-7, 1e16]),
    st.text(max_size=6),
    st.sampled_from(["%s", '"q"', "é", "%%d", "\n"]),
    st.none(),
    st.booleans(),
    st.tuples(st.integers(0, 9), st.integers(-3, 3)),
    st.tuples(st.text(max_size=3)),
    st.tuples(st.sampled_from([0.0, -0.0, 1, 1.0, True])),
    st.just(()),
)


@st.composite
def tables(draw):
    """Columns of a few records: each of one drawn type or of any, often one value repeated."""
    rows = draw(st.integers(1, 6))
    columns = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["one value", "one type", "any"]))
        if kind == "one value":
            columns.append([draw(values)] * rows)
        elif kind == "one type":
            first = draw(values)
            same = st.from_type(type(first)) if type(first) in (int, str, bool) else st.just(first)
            pool = [first, *draw(st.lists(same, max_size=3))]
            if type(first) is float:
                pool += draw(st.lists(st.floats(), max_size=3))
            columns.append([draw(st.sampled_from(pool)) for _ in range(rows)])
        else:
            columns.append(draw(st.lists(values, min_size=rows, max_size=rows)))
    return columns


@settings(max_examples=400)
@given(tables(), st.lists(st.sampled_from(["a", "b%", "step_index", 'q"', "é"]), min_size=5, max_size=5, unique=True))
def test_column_lines_are_json_dumps_of_each_record(columns, names):
    names = names[: len(columns)]
    made = column_lines(names, columns)
    expected = [json.dumps(dict(zip(names, row))) + "\n" for row in zip(*columns)]
    if made is None:  # only where a column is not one JSON type, or holds a float json writes as NaN / Infinity
        assert any(
            len(set(map(type, c))) > 1
            or type(c[0]) not in (int, float, str, tuple, type(None))
            or (type(c[0]) is float and not all(map(math.isfinite, c)))
            for c in columns
        )
    else:
        assert made == expected


def test_column_lines_by_hand():
    columns = [[1, 2], [0.5, 0.5], ["x", "x"], [(1, 2), ()], [None, None], [0.0, -0.0]]
    assert column_lines(["i", "f", "s", "t", "n", "z"], columns) == [
        '{"i": 1, "f": 0.5, "s": "x", "t": [1, 2], "n": null, "z": 0.0}\n',
        '{"i": 2, "f": 0.5, "s": "x", "t": [], "n": null, "z": -0.0}\n',
    ]
    assert column_lines(["i"], [[1, 1.0]]) is None
    assert column_lines(["f"], [[float("inf")]]) is None
    assert column_lines(["b"], [[True]]) is None


def test_kept_records_are_frozen_while_the_run_goes_on(tmp_path, monkeypatch):
    """Each chunk freezes what is alive (the kept records: the cyclic collector leaves them till
    the run ends) before it forks; closing gives them back and the collector's thresholds, so
    nothing stays frozen after, and the files are those written as the records came."""
    import gc

    monkeypatch.setattr(LinesBeside, "CHUNK", 5)
    monkeypatch.setattr(LinesBeside, "__init__", _two_cores(LinesBeside.__init__))
    counts, real_freeze = [], gc.freeze

    def freeze():
        real_freeze()
        counts.append(gc.get_freeze_count())

    monkeypatch.setattr(run_writer.gc, "freeze", freeze)
    assert gc.get_freeze_count() == 0
    before = gc.get_threshold()
    here, beside = written(tmp_path / "here", long_case(), False), written(tmp_path / "beside", long_case(), True)
    assert beside == here
    assert len(counts) >= 2 and all(n > 0 for n in counts)  # frozen at each chunk, records and all
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
