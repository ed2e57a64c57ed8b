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
