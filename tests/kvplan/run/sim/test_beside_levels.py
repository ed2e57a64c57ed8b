"""What a simulation does beside its levels and its summaries (kvplan.run.sim.run,
kvplan.results.csv_tables.StepsCsvBeside): the setup's knee found by its capacity search on a
forked process, and steps.csv written by a forked process while the summaries are made. The
run folder is the one made without them: the knee as simulated_knees finds it on its own, and
steps.csv as write_steps_csv writes it here from the records read back."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kvplan.results import csv_tables
from kvplan.results.csv_tables import StepsCsvBeside, write_steps_csv
from kvplan.results.run_result import load_run, read_result
from kvplan.run.sim import run as sim_run
from kvplan.run.sim.run import sample, simulate
from kvplan.run.sim.search import simulated_knees
from kvplan.run.sim.setups import engine_setup
from kvplan.workload.file import load_workload

WORKLOADS = Path(__file__).resolve().parents[4] / "workloads"


@pytest.fixture
def forks(monkeypatch):
    """The pids os.fork gave StepsCsvBeside (earlier tests may leave idle daemon threads alive: the
    guard counts this thread alone here), any run's steps worth a process."""
    made: list[int] = []
    real = os.fork

    def fork():
        pid = real()
        if pid:
            made.append(pid)
        return pid

    monkeypatch.setattr(csv_tables.os, "fork", fork)
    monkeypatch.setattr(csv_tables.threading, "active_count", lambda: 1)
    monkeypatch.setattr(StepsCsvBeside, "BESIDE_STEPS", 1)
    return made


def _written_here(run_dir: Path, tmp_path: Path) -> bytes:
    here = tmp_path / "here"
    here.mkdir()
    write_steps_csv(here, load_run(run_dir).steps)
    return (here / "steps.csv").read_bytes()


def test_steps_csv_written_beside_is_the_one_written_here(forks, tmp_path):
    workload = load_workload(WORKLOADS / "chat.yaml")
    run_dir = simulate(workload, engine_setup(workload)[0], tmp_path / "sim", search=False)
    assert len(forks) == 1  # steps.csv on a forked process
    assert (run_dir / "steps.csv").read_bytes() == _written_here(run_dir, tmp_path)
    assert read_result(run_dir).report_written and (run_dir / "requests.csv").stat().st_size > 0
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_failure_there_writes_steps_csv_here(forks, monkeypatch, tmp_path):
    parent, real = os.getpid(), csv_tables.write_steps_csv

    def fails_there(run_dir, steps):
        if os.getpid() != parent:
            raise OSError("the forked process fails")
        real(run_dir, steps)

    monkeypatch.setattr(csv_tables, "write_steps_csv", fails_there)
    workload = load_workload(WORKLOADS / "chat.yaml")
    run_dir = simulate(workload, engine_setup(workload)[0], tmp_path / "sim", search=False)
    assert len(forks) == 1 and read_result(run_dir).report_written
    assert (run_dir / "steps.csv").read_bytes() == _written_here(run_dir, tmp_path)


def test_with_other_threads_or_few_steps_nothing_is_forked(forks, monkeypatch, tmp_path):
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert StepsCsvBeside.start(tmp_path, [object()]) is None  # type: ignore[list-item]
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(StepsCsvBeside, "BESIDE_STEPS", 2)
    assert StepsCsvBeside.start(tmp_path, [object()]) is None and forks == []  # type: ignore[list-item]


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
