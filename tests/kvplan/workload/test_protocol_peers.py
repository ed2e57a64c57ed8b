"""The ``aiperf`` and ``guidellm`` kinds of a bucket's ``protocol:`` (kvplan.workload.protocol,
kvplan.workload.client_draws): each client's length range by hand from its source's formula and
seeded draws against a reference draw written here from that formula; a load test of the bundled
engine that sends exactly each client's warm-up, measured and cool-down requests (counted in
requests.csv); the simulation equal to it at every step; bad values as one line naming the key."""

import math
import random
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvplan.results.run_result import load_run
from kvplan.results.stats.steady import request_index
from kvplan.run.loadtest import run_loadtest
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import replay_setup
from kvplan.traffic.prompts import draw_lengths
from kvplan.workload.file import load_workload
from kvplan.workload.protocol import BenchProtocol
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.workload.test_protocol import assert_same_run

WORKLOAD = Path(__file__).resolve().parents[1] / "data" / "protocol_peers.yaml"
AIPERF_WARM, AIPERF_COUNT = 3, 8  # the file's warmup_request_count, request_count
GUIDE_SENT, GUIDE_WARM, GUIDE_COOL = 10, 2, 2  # max_requests 10; int(0.25 x 10) = 2; cooldown 2


def test_aiperf_with_stddev_0_sends_the_mean_and_its_default_count_is_10():
    protocol = BenchProtocol(kind="aiperf")
    lengths = protocol.lengths(550, "input")  # --isl 550 (its default), --isl-stddev 0: max(1, round(550))
    assert (lengths.min, lengths.max, lengths.dist) == (550, 550, "fixed")
    assert protocol.schedule().num_requests == 10  # aiperf 0.13.0's converter: 10 with no stop condition
    assert protocol.schedule().warmup_requests == 0


def aiperf_reference(mean: float, stddev: float, count: int, seed: int) -> list[int]:
    """AIPerf's rule as its source states it: max(1, ceil(x)), x ~ N(mean, stddev) redrawn while x < 0."""
    rng, out = random.Random(seed), []
    while len(out) < count:
        x = rng.gauss(mean, stddev)
        if x >= 0:
            out.append(max(1, math.ceil(x)))
    return out


def test_aiperf_draws_ceil_of_a_normal():
    lengths = BenchProtocol(kind="aiperf", input_stddev=10).lengths(100, "input")
    assert (lengths.mean, lengths.std, lengths.min) == (100.5, 10.0, 1)  # ceil(x) ~ rint(x + 0.5)
    assert lengths.max == 100 + 10 * 10 + 1  # 10 stddevs above: a cut of Phi(-10)
    n = 40_000
    drawn = draw_lengths(lengths, n, np.random.default_rng(0))
    reference = aiperf_reference(100, 10, n, seed=1)
    # E[ceil(x)] = 100.5; each sample mean's standard error is 10 / sqrt(40000) = 0.05: 5 errors
    assert abs(drawn.mean() - 100.5) < 0.25 and abs(statistics.fmean(reference) - 100.5) < 0.25
    # the same distribution: the share at or below 100 is P(x <= 100) = 0.5 for both (error 0.0025)
    assert abs((drawn <= 100).mean() - 0.5) < 0.0125
    assert abs(sum(v <= 100 for v in reference) / n - 0.5) < 0.0125
    # the stddev of ceil(x) is sqrt(100 + 1/12) = 10.004 (a rounding to whole tokens adds 1/12)
    assert abs(drawn.std() - math.sqrt(100 + 1 / 12)) < 0.15


@pytest.mark.parametrize(
    ("given", "low", "high", "dist"),
    [
        ({}, 32, 32, "fixed"),  # no stdev, no min/max: avg
        ({"input_min": 24, "input_max": 40}, 24, 40, "uniform"),  # randint(min, max)
        ({"input_min": 24}, 24, 32, "uniform"),  # max defaults to avg without a stdev
        ({"input_max": 40}, 32, 40, "uniform"),  # min defaults to max(1, avg)
        ({"input_stddev": 4}, 12, 52, "normal"),  # avg -/+ 5 stdev: 32 - 20, 32 + 20
        ({"input_stddev": 10}, 1, 82, "normal"),  # max(1, 32 - 50), 32 + 50
        ({"input_stddev": 4, "input_min": 30, "input_max": 30}, 30, 30, "fixed"),
    ],
)
def test_guidellm_draws_from_its_integer_range_sampler(given, low, high, dist):
    lengths = BenchProtocol(kind="guidellm", max_requests=10, **given).lengths(32, "input")
    assert (lengths.min, lengths.max, lengths.dist) == (low, high, dist)
    if dist == "normal":
        assert (lengths.mean, lengths.std) == (32.0, float(given["input_stddev"]))


def test_guidellm_s_draws_spread_as_its_sampler_s():
    n = 40_000
    uniform = BenchProtocol(kind="guidellm", max_requests=10, input_min=24, input_max=40).lengths(32, "input")
    drawn = draw_lengths(uniform, n, np.random.default_rng(0))
    assert (drawn.min(), drawn.max()) == (24, 40)
    # uniform on 17 integers: mean 32, stddev sqrt((17^2 - 1) / 12) = 4.899, standard error 0.0245
    assert abs(drawn.mean() - 32) < 0.12 and abs(drawn.std() - math.sqrt(288 / 12)) < 0.1
    normal = BenchProtocol(kind="guidellm", max_requests=10, input_stddev=4).lengths(32, "input")
    drawn = draw_lengths(normal, n, np.random.default_rng(1))
    rng = random.Random(2)  # GuideLLM's rule: round(clamp(gauss(32, 4), 12, 52))
    reference = [round(max(12, min(52, rng.gauss(32, 4)))) for _ in range(n)]
    assert abs(drawn.mean() - 32) < 0.1 and abs(statistics.fmean(reference) - 32) < 0.1  # error 0.02
    assert abs((drawn <= 30).mean() - sum(v <= 30 for v in reference) / n) < 0.02


@pytest.mark.parametrize(("warmup", "cooldown", "warm", "cool"), [(0.25, 2, 2, 2), (0.99, 0, 9, 0), (3.7, 0.1, 3, 1)])
def test_guidellm_s_warmup_and_cooldown_are_a_fraction_below_1_else_a_count(warmup, cooldown, warm, cool):
    plan = BenchProtocol(kind="guidellm", max_requests=10, warmup=warmup, cooldown=cooldown).schedule()
    assert (plan.warmup_requests, plan.num_requests, plan.cooldown_requests) == (warm, 10 - warm - cool, cool)
    assert not plan.warmup_drained  # sent under load, not drained


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return load_run(run_loadtest(load_workload(WORKLOAD), tmp_path_factory.mktemp("peers") / "run"))


def levels_of(run, bucket):
    by_level = {}
    for r in run.requests:
        if r.bucket == bucket:
            by_level.setdefault(int(r.level), []).append(r)
    return {c: sorted(rs, key=request_index) for c, rs in by_level.items()}


def test_the_load_test_sends_aiperf_s_counts(measured):
    levels = levels_of(measured, "aiperf")
    assert sorted(levels) == [1, 4]
    for c, records in levels.items():
        assert len(records) == AIPERF_WARM + AIPERF_COUNT  # requests.csv: 3 warm-ups and 8 measured
        warm, timed = records[:AIPERF_WARM], records[AIPERF_WARM:]
        # the warm-ups all return before the profiling phase sends; then c go together
        assert max(r.finish_time for r in warm) <= min(r.arrival_time for r in timed)
        wave = min(r.token_times[0] for r in timed)
        assert sum(r.arrival_time < wave for r in timed) == c
        # the warm-ups are ordinary prompts (the bucket's first three), not copies of one; the
        # measured ones cycle the 8 sampled, so the last three are the warm-ups' prompts again
        assert len({r.num_prompt_tokens for r in warm}) > 1
        assert [r.num_prompt_tokens for r in timed[-AIPERF_WARM:]] == [r.num_prompt_tokens for r in warm]
        assert all(r.num_prompt_tokens >= 1 and r.num_output_tokens >= 1 for r in records)
    assert len({r.num_prompt_tokens for r in measured.requests if r.bucket == "aiperf"}) >= 4  # lengths spread


def test_the_load_test_sends_guidellm_s_counts(measured):
    ((c, records),) = levels_of(measured, "guidellm").items()
    assert c == 3 and len(records) == GUIDE_SENT  # --max-requests counts every request sent
    warm, timed = records[:GUIDE_WARM], records[GUIDE_WARM : GUIDE_SENT - GUIDE_COOL]
    # not drained: the first measured request goes with the warm-ups, 3 streams from the start
    assert timed[0].arrival_time < min(r.finish_time for r in warm)
    assert timed[1].arrival_time >= min(r.finish_time for r in records[:3])  # the 4th waits for a completion
    assert all(24 <= r.num_prompt_tokens <= 40 and r.num_output_tokens == 8 for r in records)


def test_the_summaries_count_the_measured_requests_with_their_means(measured):
    counts = {"aiperf": AIPERF_COUNT, "guidellm": GUIDE_SENT - GUIDE_WARM - GUIDE_COOL}
    for level in measured.result.levels:
        assert level.num_completed == counts[level.bucket]
        assert level.ttft_ms.count == counts[level.bucket]
        assert level.ttft_ms.mean > 0 and level.ttft_ms.p50 > 0
    assert "TTFT mean ms" in (measured.run_dir / "summary.md").read_text()


def test_the_simulation_equals_the_peer_protocol_run_at_every_step(measured, tmp_path):
    workload = load_workload(WORKLOAD)
    run = load_run(simulate(workload, replay_setup(workload, measured.run_dir), tmp_path / "sim", search=False))
    assert_same_run(run, measured)


@pytest.mark.parametrize(
    ("bucket", "change", "field", "says"),
    [
        (0, {"input_stddev": -1}, "buckets[0].protocol.input_stddev", ">= 0"),
        (1, {"output_stddev": -3}, "buckets[1].protocol.output_stddev", ">= 0"),
        (1, {"input_stddev": 0}, "buckets[1].protocol", "input_stddev must be > 0"),
        (1, {"input_min": 41}, "buckets[1]", "input_min/input_max"),  # min 41 > max 40
        (0, {"max_requests": 10}, "buckets[0].protocol", "max_requests applies to guidellm only"),
        (1, {"request_count": 10}, "buckets[1].protocol", "request_count applies to aiperf only"),
        (0, {"random_range_ratio": 0.5}, "buckets[0].protocol", "random_range_ratio applies to"),
        (1, {"max_requests": None}, "buckets[1].protocol", "needs max_requests"),
        (1, {"warmup": 8}, "buckets[1].protocol", "leave no measured request"),  # 8 + 2 of 10
        (0, {"request_count": 3}, "buckets[0]", "raise request_count"),  # 3 < concurrency 4
        (0, {"warmup_request_count": -1}, "buckets[0].protocol.warmup_request_count", ">= 0"),
    ],
)
def test_bad_peer_protocol_values_are_one_line_naming_the_key(bucket, change, field, says, tmp_path):
    data = yaml.safe_load(WORKLOAD.read_text())
    data["buckets"][bucket]["protocol"].update(change)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    code, _, err = run_cli("simulate", str(path), "--out", str(tmp_path / "out"))
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0] and says in lines[0] and "Traceback" not in err, err
