"""What a simulation does beside its levels and its summaries (kvplan.run.sim.run,
kvplan.results.writing.run_writer.LinesBeside, kvplan.results.csv_tables.StepsCsvChunks): the setup's knee
found by its capacity search on a forked process, and the JSONL lines and steps.csv made a chunk
at a time by forked processes, the last while the summaries are made. The run folder is the one
made without them: the knee as simulated_knees finds it on its own, and steps.csv as
write_steps_csv writes it here from the records read back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvplan.results.csv_tables import write_steps_csv
from kvplan.results.run_result import load_run, read_result
from kvplan.results.writing import run_writer
from kvplan.results.writing.run_writer import LinesBeside
from kvplan.run.sim import run as sim_run
from kvplan.run.sim.run import sample, simulate
from kvplan.run.sim.search import simulated_knees
from kvplan.run.sim.setups import engine_setup
from kvplan.workload.file import load_workload

WORKLOADS = Path(__file__).resolve().parents[4] / "workloads"


@pytest.fixture
def forks(monkeypatch):
    """The pids os.fork gave (LinesBeside's chunks; the knee's search pool forks through
    multiprocessing's own reference, not counted)."""
    made: list[int] = []
    real = os.fork

    def fork():
        pid = real()
        if pid:
            made.append(pid)
        return pid

    monkeypatch.setattr(run_writer.os, "fork", fork)
    monkeypatch.setattr(LinesBeside, "__init__", _two_cores(LinesBeside.__init__))
    return made


def _two_cores(init):
    def made(self, run_dir, kept):
        init(self, run_dir, kept)
        self.fork = hasattr(os, "fork")

    return made


def _written_here(run_dir: Path, tmp_path: Path) -> bytes:
    here = tmp_path / "here"
    here.mkdir()
    write_steps_csv(here, load_run(run_dir).steps)
    return (here / "steps.csv").read_bytes()


def test_steps_csv_made_in_chunks_is_the_one_written_here(forks, tmp_path):
    """chat.yaml's steps, fewer than a chunk: the one chunk goes to a forked process when the
    levels end, while the summaries are made; steps.csv is its table, put in place."""
    workload = load_workload(WORKLOADS / "chat.yaml")
    run_dir = simulate(workload, engine_setup(workload)[0], tmp_path / "sim", search=False)
    assert len(forks) == 1
    assert (run_dir / "steps.csv").read_bytes() == _written_here(run_dir, tmp_path)
    assert read_result(run_dir).report_written and (run_dir / "requests.csv").stat().st_size > 0
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")]


def test_a_failure_there_writes_the_lines_and_steps_csv_here(forks, monkeypatch, tmp_path):
    """The last chunk's process fails: its lines are written here, and steps.csv by the report."""
    parent, real = os.getpid(), LinesBeside._write

    def fails_there(self, spans):
        if os.getpid() != parent:
            raise OSError("the forked process fails")
        real(self, spans)

    monkeypatch.setattr(LinesBeside, "_write", fails_there)
    workload = load_workload(WORKLOADS / "chat.yaml")
    run_dir = simulate(workload, engine_setup(workload)[0], tmp_path / "sim", search=False)
    assert len(forks) == 1 and read_result(run_dir).report_written
    assert (run_dir / "steps.csv").read_bytes() == _written_here(run_dir, tmp_path)
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")]
    kv = read_result(run_dir).kv
    assert kv is not None and kv.num_steps > 0
    assert len((run_dir / "steps.jsonl").read_text().splitlines()) == kv.num_steps
    assert len((run_dir / "requests.jsonl").read_text().splitlines()) == kv.num_requests


@pytest.mark.parametrize("complete", [True, False])
def test_the_knee_found_beside_the_levels_is_the_one_found_alone(monkeypatch, tmp_path, complete):
    workload = load_workload(WORKLOADS / "smoke.yaml")
    setup = engine_setup(workload)[0]
    alone = simulated_knees(workload, setup.facts, sample(workload, setup.facts).requests)
    assert any(knee is not None for knee in alone.values())
    if not complete:  # a run that did not complete: no capacity, the knees found here
        real = sim_run.run_levels
        monkeypatch.setattr(sim_run, "run_levels", lambda *a, **k: (real(*a, **k), "interrupted")[1])
    result = read_result(simulate(workload, setup, tmp_path / "sim"))
    assert {b.name: b.simulated_knee for b in result.estimate.buckets} == alone
    if complete:
        assert {b.name: b.knee for b in result.capacity[0].buckets} == alone
    else:
        assert result.status == "interrupted" and not result.capacity


def _sigint_handler() -> list:
    import signal

    return [signal.getsignal(signal.SIGINT) is signal.SIG_IGN]


def test_searches_beside_leave_ctrl_c_to_the_run(monkeypatch):
    """The forked searches ignore Ctrl-C: the run stops them (collect(False)) and writes its report;
    a search that took it would print its own traceback."""
    import signal

    monkeypatch.setattr(sim_run, "search_jobs", lambda: 2)
    # Python's own handler here, whatever this process inherited (a job started in the background
    # by a shell without job control starts with SIGINT ignored)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        collect = sim_run.search_beside([_sigint_handler, _sigint_handler])
        assert collect(True) == [[True], [True]]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # this process's own is untouched
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("json_output", [False, True])
def test_an_interrupted_simulate_exits_130_with_its_report(monkeypatch, tmp_path, json_output):
    """Ctrl-C during the levels (run_levels says interrupted): the report of what finished is
    written, and kvplan simulate exits 130 with one line, as kvplan loadtest does (docs/loadtest.md)."""
    from tests.kvplan.cli_runner import run_cli

    real = sim_run.run_levels
    monkeypatch.setattr(sim_run, "run_levels", lambda *a, **k: (real(*a, **k), "interrupted")[1])
    out = tmp_path / "sim"
    args = ["simulate", str(WORKLOADS / "smoke.yaml"), "--out", str(out), *(["--json"] if json_output else ["--quiet"])]
    code, stdout, stderr = run_cli(*args)
    assert code == 130
    assert f"interrupted: the report keeps the requests that finished ({out})" in " ".join(stderr.split())
    assert read_result(out).status == "interrupted" and read_result(out).report_written
    assert ('"status": "interrupted"' in stdout) if json_output else (f"report: {out}" in stdout)
