"""The searches' arithmetic: bisection for the highest concurrency, doubling then bisection for the
highest rate, the levels ``concurrency: auto`` picks, and a load test that picks them."""

import math
from pathlib import Path

import pytest
import yaml

from kvplan.results.run_result import load_run
from kvplan.run.loadtest import run_loadtest
from kvplan.run.sim.brackets import highest_int as _highest_int
from kvplan.run.sim.brackets import highest_rate as _highest_rate
from kvplan.run.sim.search import levels_around
from kvplan.workload.file import load_workload, parse_workload

SMOKE = Path(__file__).resolve().parents[4] / "workloads" / "smoke.yaml"


@pytest.mark.parametrize(
    "limit, top, expected",
    [(0, 10, (None, 1)), (1, 10, (1, 2)), (7, 10, (7, 8)), (10, 10, (10, None)), (13, 10, (10, None))],
)
def test_the_highest_concurrency_meeting_a_threshold_and_the_lowest_failing_above_it(limit, top, expected):
    asked = []

    def ok(n):
        asked.append(n)
        return n <= limit

    assert _highest_int(ok, top) == expected
    assert len(asked) <= 2 + math.ceil(math.log2(top))  # top, 1, then bisection


@pytest.mark.parametrize("limit", [37, 100, 255])
def test_the_concurrency_search_stops_within_its_precision(limit):
    found, above = _highest_int(lambda n: n <= limit, 256, 1.02)
    assert found <= limit < above and (above - found <= 1 or above <= found * 1.02)


@pytest.mark.parametrize("limit, start", [(3.7, 1.0), (3.7, 50.0), (0.013, 1.0), (1.0, 1.0)])
def test_the_highest_rate_meeting_a_threshold_to_within_2_percent(limit, start):
    found, above = _highest_rate(lambda r: r <= limit, start)
    assert found <= limit < above and found >= limit / 1.02 and above <= found * 1.02
    assert found == float(f"{found:.4g}")  # named as a workload would name it


def test_the_rate_search_goes_no_higher_than_its_top():
    asked = []

    def ok(r):
        asked.append(r)
        return True

    assert _highest_rate(ok, 1.0, top=10.0) == (10.0, None) and max(asked) == 10.0


@pytest.mark.parametrize("limit", [9.5, 10.0, 30.0, 0.5])
def test_the_top_asked_first_is_the_answer_alone_when_it_holds_else_the_search_goes_on_as_without(limit):
    """ok(r) = r <= limit, from 9.8 to a top of 10: where 10 holds, it is the only rate asked;
    where it fails, the answer and the rates asked after it are the plain search's."""
    asked: dict[bool, list[float]] = {True: [], False: []}

    def search(first: bool):
        ok = lambda r: asked[first].append(r) or r <= limit  # noqa: E731
        return _highest_rate(ok, 9.8, top=10.0, top_first=first)

    assert search(True) == search(False)
    if limit >= 10.0:
        assert asked[True] == [10.0] and asked[False] == [9.8, 10.0]
    else:
        assert asked[True] == [10.0, *asked[False]]


def test_no_rate_meets_it_when_even_the_lowest_fails():
    found, _ = _highest_rate(lambda r: False, 1.0)
    assert found is None


@pytest.mark.parametrize(
    "knee, num_requests, levels",
    [(9, 48, [1, 7, 8, 9, 10]), (2, 8, [1, 2, 3]), (1, 8, [1, 2]), (8, 8, [1, 6, 7, 8]), (None, 8, [1, 8])],
)
def test_levels_around_the_knee(knee, num_requests, levels):
    assert levels_around(knee, num_requests) == levels


def test_concurrency_auto_is_read_and_refused_where_it_cannot_stand(tmp_path):
    data = yaml.safe_load(SMOKE.read_text())
    data["buckets"][0]["concurrency"] = "auto"
    assert parse_workload(data).buckets[0].concurrency == "auto"
    data["buckets"][0]["concurrency"] = "many"
    with pytest.raises(Exception, match="concurrency"):
        parse_workload(data)


def test_a_load_test_with_concurrency_auto_measures_the_knee_at_single_request_resolution(tmp_path):
    data = yaml.safe_load(SMOKE.read_text())
    data["buckets"][0]["concurrency"] = "auto"
    data["buckets"][0]["request_rates"] = []
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(data))
    run = load_run(run_loadtest(load_workload(path), tmp_path / "run"))
    bucket = run.result.buckets[0]
    # smoke's requests first preempt at 8 in flight in simulation: levels 1, 6, 7, 8 are run
    assert bucket.simulated_knee == 8 and bucket.levels_run == [1, 6, 7, 8]
    assert (bucket.measured_knee, bucket.max_clean_concurrency) == (8, 7)
    assert run.result.workload.config["buckets"][0]["concurrency"] == [1, 6, 7, 8]
