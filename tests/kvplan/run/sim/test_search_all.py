"""kvplan simulate's targets searched on forked processes (kvplan.run.sim.run.search_all): the same
answers, in order, as one after the other here."""

import os

import pytest

from kvplan.run.sim.run import search_all


def test_the_searches_run_on_forked_processes_and_come_back_in_order(monkeypatch):
    monkeypatch.setenv("KVPLAN_SEARCH_JOBS", "2")
    parent = os.getpid()
    table = {"a": 3, "b": 5}  # a closure over this process's objects: nothing pickled but the answers
    searches = [lambda k=k: [k, table[k] * 2, os.getpid()] for k in ("a", "b", "a")]
    found = search_all(searches)
    assert [f[:2] for f in found] == [["a", 6], ["b", 10], ["a", 6]]
    assert all(f[2] != parent for f in found)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_one_search_or_one_job_runs_here(monkeypatch, jobs):
    monkeypatch.setenv("KVPLAN_SEARCH_JOBS", jobs)
    searches = [lambda: [os.getpid()]] * (1 if jobs == "2" else 3)
    assert all(f == [os.getpid()] for f in search_all(searches))


def test_searches_beside_run_on_forked_processes_while_this_one_goes_on(monkeypatch, tmp_path):
    """search_beside: started at once on forked processes (a search waits for a file this process
    writes after the start, so they overlap), the answers in order; collect(False) stops them and
    answers None."""
    import time

    from kvplan.run.sim.run import search_beside

    monkeypatch.setenv("KVPLAN_SEARCH_JOBS", "2")
    parent, flag = os.getpid(), tmp_path / "go"

    def waits(k):
        deadline = time.monotonic() + 30
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return [k, flag.exists(), os.getpid()]

    collect = search_beside([lambda: waits("a"), lambda: waits("b")])
    flag.write_text("")  # after the start: only a search running beside this process sees it
    found = collect(True)
    assert [f[:2] for f in found] == [["a", True], ["b", True]]
    assert all(f[2] != parent for f in found)
    stopped = search_beside([lambda: time.sleep(60) or [1]])
    started = time.monotonic()
    assert stopped(False) is None
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_searches_beside_with_one_job_run_here_when_collected(monkeypatch, jobs):
    from kvplan.run.sim.run import search_beside

    monkeypatch.setenv("KVPLAN_SEARCH_JOBS", jobs)
    calls = []
    collect = search_beside([lambda: calls.append(1) or [os.getpid()]])
    if jobs == "1":
        assert calls == []  # nothing yet: it runs at collect(True), here
        assert collect(True) == [[os.getpid()]] and calls == [1]
        assert collect(False) is None
    else:
        assert collect(True) != [[os.getpid()]]
