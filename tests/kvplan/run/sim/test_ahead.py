"""Capacity probes side by side (kvplan.run.sim.ahead): a probe simulated on a forked process is
the one simulated here, so a search with them answers as one that simulates its probes one after
another, with the same scores."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kvplan.run.sim import ahead as ahead_module
from kvplan.run.sim.ahead import Probes, side_by_side
from kvplan.run.sim.cli_setup import setups_for
from kvplan.run.sim.run import sample
from kvplan.run.sim.search import Prober
from kvplan.workload.file import load_workload

SMOKE = Path(__file__).resolve().parents[4] / "workloads" / "smoke.yaml"


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """side_by_side forks only from a process of one thread; earlier tests in the same pytest
    process may leave idle daemon threads (servers, clients) alive, so the fork guard here counts
    this thread alone (the forked process runs only the probe, under locks re-made at fork)."""
    monkeypatch.setattr(ahead_module.threading, "active_count", lambda: 1)


def test_with_other_threads_alive_nothing_is_forked(monkeypatch):
    monkeypatch.setattr(ahead_module.threading, "active_count", lambda: 2)
    here, pending = side_by_side(lambda: os.getpid(), lambda: os.getpid())
    assert here == os.getpid() and pending is None


def test_there_runs_on_a_forked_process_while_here_runs_in_this_one():
    here, pending = side_by_side(lambda: (os.getpid(), [1, 2]), lambda: (os.getpid(), {"a": 3.5}))
    assert here == (os.getpid(), [1, 2]) and pending is not None
    there = pending.result()
    assert there[0] != os.getpid() and there[1] == {"a": 3.5}  # pickled back


def test_a_forked_probe_never_asked_is_stopped():
    here, pending = side_by_side(lambda: 1, lambda: time.sleep(60))
    assert here == 1 and pending is not None
    started = time.perf_counter()
    pending.cancel()
    assert time.perf_counter() - started < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(pending.pid, 0)  # reaped


def test_a_failure_there_leaves_it_to_the_caller_and_here_still_answers():
    def fails():
        raise ValueError("there")

    here, pending = side_by_side(lambda: 7, fails)
    assert here == 7 and pending is not None and pending.result() is None


def test_probes_kept_side_by_side_carry_their_scores_and_without_ahead_none_run_early():
    asked: list[tuple[str, float]] = []

    def simulate(mode, level):
        asked.append((mode, level))
        return f"{mode}@{level}", level / 10

    scores: dict = {}
    probes = Probes(simulate, scores, 3, ahead=True)
    probes.both(("open", 1.5), ("open", 3.0))
    assert probes == {("open", 1.5): "open@1.5"} and list(probes.pending) == [("open", 3.0)]
    assert asked == [("open", 1.5)]  # here; the other on the forked process
    assert probes.probe("open", 3.0) == "open@3.0" and asked == [("open", 1.5)]  # taken, not simulated again
    assert scores == {(3, "open", 1.5): 0.15, (3, "open", 3.0): 0.3} and not probes.pending
    plain = Probes(simulate, {}, 3, ahead=False)
    plain.both(("closed", 8), ("closed", 9))
    assert plain == {} and plain.probe("closed", 9) == "closed@9" and asked[-1] == ("closed", 9)


def test_a_capacity_search_with_probes_side_by_side_answers_as_one_after_another():
    """smoke.yaml on an H100 (Llama-3.1-8B): every answer, edge and probe score equal; some probes
    ran on forked processes (fewer simulated here)."""
    workload = load_workload(SMOKE)
    setup, _, _ = setups_for(
        workload, calibrate=None, model="llama-3.1-8b", gpu="H100-SXM", tp=1, kv_cache_dtype="auto",
        weight_dtype="auto", gpu_memory_utilization=None, replay=None, attainment=0.95,
    )  # fmt: skip
    sampled = sample(workload, setup.facts).requests
    here: dict[bool, int] = {True: 0, False: 0}
    runs, parent = {}, os.getpid()
    for ahead in (False, True):
        prober = Prober(workload, setup.facts, setup.clock, sampled, ahead=ahead)
        level = prober.level

        def counted(*args, ahead=ahead, level=level, **kwargs):
            here[ahead] += os.getpid() == parent
            return level(*args, **kwargs)

        prober.level = counted  # type: ignore[method-assign]
        runs[ahead] = ([prober.capacity(i, 0.95, None) for i in range(len(workload.buckets))], prober.scores)
    (answers, scores), (plain, plain_scores) = runs[True], runs[False]
    assert answers == plain
    # every probe the plain search simulated, with its score; a level simulated ahead that the
    # search did not then ask is one more score
    assert plain_scores.items() <= scores.items()
    assert 0 < here[True] < here[False]


def test_probes_ahead_as_a_call_go_side_by_side_only_while_it_says_so():
    asked: list[tuple[str, float]] = []

    def simulate(mode, level):
        asked.append((mode, level))
        return f"{mode}@{level}", None

    levels_done = [False]  # a search beside a simulation's levels: side by side once they are done
    probes = Probes(simulate, {}, 0, ahead=lambda: levels_done[0])
    probes.both(("closed", 8), ("closed", 9))
    assert probes == {} and not probes.pending and asked == []  # nothing simulated early
    levels_done[0] = True
    probes.both(("closed", 10), ("closed", 11))
    assert asked == [("closed", 10)] and list(probes.pending) == [("closed", 11)]
    assert probes.probe("closed", 11) == "closed@11" and asked == [("closed", 10)]
