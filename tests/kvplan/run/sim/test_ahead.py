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


def test_probes_ahead_as_a_call_wait_for_the_levels_in_their_forked_process():
    """A search beside a simulation's levels: while ``ahead()`` says no (the levels hold the other
    core), the second probe still goes to a forked process, which sleeps till the levels are done
    (the flag is shared memory, as the simulation's is); asked while they still run, it is stopped
    and simulated here. Once they are done it runs, while this process is still on the first."""
    import multiprocessing

    parent = os.getpid()
    levels_done = multiprocessing.RawValue("b", 0)
    asked: list[tuple[str, float]] = []

    def simulate(mode, level):
        asked.append((mode, level))
        if os.getpid() == parent and level == 10:
            levels_done.value = 1  # the levels end while this process simulates the first
            time.sleep(0.5)
        return f"{mode}@{level} in {'here' if os.getpid() == parent else 'fork'} at {time.monotonic():.3f}", None

    probes = Probes(simulate, {}, 0, ahead=lambda: bool(levels_done.value))
    probes.both(("closed", 8), ("closed", 9))
    assert asked == [("closed", 8)] and probes.pending[("closed", 9)].gated
    time.sleep(0.2)
    assert not probes.pending[("closed", 9)].ready()  # asleep: not started while the levels run
    assert probes.probe("closed", 9).startswith("closed@9 in here")  # stopped, and simulated here
    assert asked == [("closed", 8), ("closed", 9)]
    before = time.monotonic()
    probes.both(("closed", 10), ("closed", 11))  # here: 10 ends the levels, then takes 0.5 s
    after = time.monotonic()
    result = probes.probe("closed", 11)
    assert result.startswith("closed@11 in fork") and ("closed", 11) not in asked
    assert before < float(result.rsplit(" ", 1)[1]) < after  # ran while this one was on the first
    probes.both(("closed", 12), ("closed", 13))  # the levels done: not gated
    assert not probes.pending[("closed", 13)].gated
    assert probes.probe("closed", 13).startswith("closed@13 in fork")


def test_a_forked_probe_waiting_for_the_levels_leaves_when_its_search_is_gone():
    """A search stopped (its pool worker killed, as an interrupted run's are) before the levels end:
    the probe its process forked, still waiting for them, leaves instead of running on alone."""
    import signal

    read, write = os.pipe()
    worker = os.fork()
    if worker == 0:  # the search's process: forks a gated probe, reports its pid, then waits to be killed
        os.close(read)
        _, pending = side_by_side(lambda: None, lambda: "never", gate=lambda: False)
        os.write(write, str(pending.pid).encode())
        time.sleep(60)
        os._exit(0)
    os.close(write)
    probe = int(os.read(read, 64))
    os.kill(worker, signal.SIGKILL)
    os.waitpid(worker, 0)

    def alive(pid: int) -> bool:  # a zombie no one has reaped yet has left too
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while alive(probe) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(probe), "the waiting probe outlived its search"
