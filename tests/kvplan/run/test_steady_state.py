"""Steady-state levels on the tiny random model: warm-up and cool-down requests are sent, recorded
and kept out of every statistic; a timed level keeps N in flight until its duration is up.

Every statistic is recomputed here from the raw records with numpy, over the requests this test
picks as measured by hand (by index and arrival time), and compared with the run's summary."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvplan.results.run_result import load_run
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[3]
SMOKE = yaml.safe_load((ROOT / "workloads" / "smoke.yaml").read_text())


def _index(record) -> int:
    return int(record.request_id.rsplit("/", 1)[1])


def _run(tmp_path, bucket: dict):
    workload = {**SMOKE, "name": "steady", "buckets": [bucket]}
    workload.pop("plan")
    path = tmp_path / "steady.yaml"
    path.write_text(yaml.safe_dump(workload))
    run_dir = tmp_path / "run"
    code, out, err = run_cli("loadtest", str(path), "--out", str(run_dir), "--quiet")
    assert (code, err) == (0, ""), err
    return run_dir, load_run(run_dir)


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    """4 in flight; 3 warm-up requests, then the 8 measured, then 4 cool-down requests."""
    bucket = {"name": "short", "input_tokens": [12, 20], "output_tokens": 12, "concurrency": [4],
              "num_requests": 8, "warmup": 3, "cooldown": 4}  # fmt: skip
    return _run(tmp_path_factory.mktemp("counted"), bucket)


def test_warmup_and_cooldown_requests_are_sent_and_recorded(counted):
    _, data = counted
    assert sorted(_index(r) for r in data.requests) == list(range(3 + 8 + 4))
    # request i is the bucket's i % 8: the same prompt lengths come round again
    by_index = {_index(r): r for r in data.requests}
    assert all(by_index[i].num_prompt_tokens == by_index[i % 8].num_prompt_tokens for i in range(15))
    # a second round never shares its salt with the first (no prefix hits on its own earlier blocks)
    assert by_index[8].cache_salt != by_index[0].cache_salt and by_index[0].cache_salt == by_index[1].cache_salt


def test_excluded_requests_are_absent_from_every_latency_statistic(counted):
    run_dir, data = counted
    (level,) = data.result.levels
    measured = [r for r in data.requests if 3 <= _index(r) < 11]
    assert (level.num_requests, level.num_excluded, level.num_completed) == (8, 7, 8)
    ttft = [(r.token_times[0] - r.arrival_time) * 1e3 for r in measured]
    e2e = [(r.finish_time - r.arrival_time) * 1e3 for r in measured]
    tpot = [(r.finish_time - r.token_times[0]) / (r.num_output_tokens - 1) * 1e3 for r in measured]
    for stats, values in ((level.ttft_ms, ttft), (level.e2e_ms, e2e), (level.tpot_ms, tpot)):
        assert stats.p50 == pytest.approx(np.percentile(values, 50))
        assert stats.p99 == pytest.approx(np.percentile(values, 99))
        assert (stats.count, stats.mean) == (len(values), pytest.approx(np.mean(values)))
    t0 = min(r.arrival_time for r in data.requests)
    span = max(r.finish_time for r in measured) - min(r.arrival_time for r in measured)
    assert level.duration_s == pytest.approx(span)
    # rates over the window (its first instant left out), from every request's tokens in it: the
    # load on the engine in the window, warm-up and cool-down requests included
    start, end = min(r.arrival_time for r in measured), max(r.finish_time for r in measured)
    in_window = sum(start < t <= end for r in data.requests for t in r.token_times)
    finished = sum(start < r.finish_time <= end for r in data.requests)
    assert level.output_tokens_per_s == pytest.approx(in_window / span)
    assert level.requests_per_s == pytest.approx(finished / span)
    assert (level.window_start_s, level.window_end_s) == pytest.approx(
        (min(r.arrival_time for r in measured) - t0, max(r.finish_time for r in measured) - t0)
    )
    # steps outside the window are out too: the level's steps are those overlapping it
    start, end = t0 + level.window_start_s, t0 + level.window_end_s
    inside = [s for s in data.steps if s.end_time > start and s.start_time < end]
    assert 0 < level.num_steps == len(inside) < len(data.steps)
    # report --json says how many were excluded and which window was measured
    code, out, _ = run_cli("report", str(run_dir), "--json")
    (row,) = json.loads(out)["buckets"][0]["levels"]
    assert code == 0 and (row["num_measured"], row["num_excluded"]) == (8, 7)
    assert row["window_start_s"] == pytest.approx(level.window_start_s)


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    """4 in flight for 1.5 s of the engine's clock; requests arriving in the first 0.3 s and the
    last 0.3 s of sending are excluded."""
    bucket = {"name": "short", "input_tokens": [12, 20], "output_tokens": 12, "concurrency": [4],
              "num_requests": 8, "duration_s": 1.5, "warmup": "0.3s", "cooldown": "300ms"}  # fmt: skip
    return _run(tmp_path_factory.mktemp("timed"), bucket)


def test_a_timed_level_keeps_n_in_flight_until_its_duration_is_up(timed):
    _, data = timed
    t0 = min(r.arrival_time for r in data.requests)
    arrivals = sorted(r.arrival_time - t0 for r in data.requests)
    assert len(arrivals) > 8  # the 8 sampled requests were cycled
    assert arrivals[-1] < 1.5  # nothing is sent once the duration is up
    # every step before the end of sending ran with 4 in flight (running + waiting after it + finished in it)
    sending = [s for s in data.steps if s.end_time < t0 + 1.5]
    assert sending and all(s.num_running + s.num_waiting + s.num_finished == 4 for s in sending)


def test_a_timed_levels_window_leaves_out_its_first_and_last_seconds(timed):
    _, data = timed
    (level,) = data.result.levels
    t0 = min(r.arrival_time for r in data.requests)
    measured = [r for r in data.requests if 0.3 <= r.arrival_time - t0 <= 1.5 - 0.3]
    assert level.num_requests == len(measured) > 0
    assert level.num_excluded == len(data.requests) - len(measured) > 0
    ttft = [(r.token_times[0] - r.arrival_time) * 1e3 for r in measured]
    assert level.ttft_ms.p50 == pytest.approx(np.percentile(ttft, 50))
    assert level.window_start_s >= 0.3 and not level.partial
