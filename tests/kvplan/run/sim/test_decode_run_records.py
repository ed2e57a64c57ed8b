"""A simulated level's run-folder records with decode runs written at once (RunWriter.write_decode_run,
kvplan.results.run_lines) are the records of the scheduler stepping one step at a time: on the
random workloads of test_decode_runs (hypothesis; preemption, chunked prefill, prefix caching,
prefill-first, front-end lag, sessions, admission), steps.jsonl and requests.jsonl byte for byte,
and the kept rows the report reads."""

from hypothesis import HealthCheck, given, settings

from kvplan.results.records import LevelKey
from kvplan.results.store import KeptRecords
from kvplan.results.writing.run_writer import RunWriter
from kvplan.run.driver import Level, Recorder, run_level
from kvplan.run.estimate import KVPricing
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.cost import ModelClock
from tests.kvplan.run.sim.test_decode_runs import COST, cases


def written(tmp_path, case, decode_runs: bool) -> tuple[bytes, bytes, list]:
    engine, requests, mode, value, plan, lag, admission = case
    level = Level(LevelKey("b", mode, value, ""), 0, tuple(requests), plan)
    backend = SimBackend(engine, ModelClock(COST, lag), decode_runs=decode_runs, admission=admission)
    pricing = KVPricing(3, engine.block_size, engine.max_model_len, 5)
    folder = tmp_path / f"runs-{decode_runs}"
    kept = KeptRecords()
    with RunWriter(folder, flush=decode_runs, kept=kept) as writer:  # flushed and chunked both
        run_level(backend, level, Recorder(writer, level, pricing.step_bytes), seed=0)
    return (folder / "steps.jsonl").read_bytes(), (folder / "requests.jsonl").read_bytes(), kept.steps.rows


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(cases())
def test_records_of_decode_runs_are_the_records_of_the_steps(tmp_path_factory, case):
    tmp_path = tmp_path_factory.mktemp("records")
    fast, slow = written(tmp_path, case, True), written(tmp_path, case, False)
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]
    assert slow[0].count(b"\n") == len(slow[2])


def test_a_long_decode_level_writes_its_runs_at_once(tmp_path, monkeypatch):
    """Three requests of 60 output tokens: most steps are decode runs, each written at once (the
    fast path taken, counted), and the files are those of the steps one by one."""
    import kvplan.results.writing.run_writer as store
    from kvplan.results import run_lines
    from kvplan.traffic.requests import SampledRequest
    from tests.kvplan.run.sim.test_decode_runs import facts

    made = []

    def counted(*args, **kwargs):
        out = run_lines.decode_run_records(*args, **kwargs)
        made.append(out is not None)
        return out

    monkeypatch.setattr(store, "decode_run_records", counted)
    requests = [SampledRequest(tuple(range(i, i + 9)), 60, "random") for i in range(3)]
    case = (facts(4, 200, 8, 64, True), requests, "closed", 3, None, 0.0, None)
    fast, slow = written(tmp_path, case, True), written(tmp_path, case, False)
    assert fast == slow
    assert made and all(made)
    assert len(slow[2]) == 60  # by hand: one prefill step (sampling token 1 of each), 59 decode steps
