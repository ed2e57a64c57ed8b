"""A target's server-side numbers over a steady-state level's measured window only, worked out by
hand (times in seconds on the run's clock; counters are the server's totals)."""

from kvplan.results import metrics
from kvplan.results.metrics import Slo
from kvplan.results.records import LevelKey, RequestRecord
from kvplan.results.stats.server_samples import ServerSample, in_window, level_server_stats
from kvplan.results.stats.steady import LevelSchedule
from kvplan.results.summarize import with_server_stats

KEY = LevelKey("b", "closed", 2.0)


def sample(t, preempted, usage, generated, boundary=False):
    return ServerSample(
        time=t,
        bucket="b",
        mode="closed",
        level=2.0,
        boundary=boundary,
        kv_usage=usage,
        preemptions_total=preempted,
        generation_tokens_total=generated,
    )


# a level from t=10 to t=20: 3 preemptions in the warm-up (before 12), 2 in the window, 4 in the
# cool-down (after 17); the KV peak of 0.9 falls in the cool-down
SAMPLES = [
    sample(10.0, 100, 0.1, 1000, boundary=True),
    sample(11.0, 103, 0.5, 1040),
    sample(12.0, 103, 0.6, 1080),
    sample(14.0, 104, 0.7, 1160),
    sample(17.5, 105, 0.4, 1300),
    sample(19.0, 109, 0.9, 1360),
    sample(20.0, 109, 0.2, 1400, boundary=True),
]


def test_a_plain_level_counts_every_read():
    stats = level_server_stats(SAMPLES)[KEY]
    assert stats.preemptions == 9
    assert stats.peak_kv_usage == 0.9
    assert stats.generation_tokens == 400
    assert stats.num_samples == 7


def test_a_window_counts_from_the_read_before_its_start_to_the_read_after_its_end():
    assert [s.time for s in in_window(SAMPLES, (12.5, 17.0))] == [12.0, 14.0, 17.5]
    stats = level_server_stats(SAMPLES, {KEY: (12.5, 17.0)})[KEY]
    assert stats.preemptions == 105 - 103
    assert stats.generation_tokens == 1300 - 1080
    assert stats.peak_kv_usage == 0.7
    assert abs(stats.mean_kv_usage - (0.6 + 0.7 + 0.4) / 3) < 1e-12
    # a window past every read keeps the reads it has
    assert [s.time for s in in_window(SAMPLES, (19.5, 30.0))] == [19.0, 20.0]


def req(index, arrival, finish):
    return RequestRecord(
        request_id=f"b/closed/2/{index}",
        bucket="b",
        mode="closed",
        level=2.0,
        arrival_time=arrival,
        first_scheduled_time=arrival,
        finish_time=finish,
        token_times=(arrival + 0.5, finish),
        num_prompt_tokens=10,
        num_output_tokens=2,
        max_tokens=2,
        finish_reason="length",
    )


def test_a_steady_level_s_server_numbers_cover_its_measured_requests_only():
    # 1 warm-up, 2 measured, 1 cool-down request: the window runs from the first measured arrival
    # (12.5) to the last measured finish (17.0), seconds from the level's first arrival (10.0)
    requests = [req(0, 10.0, 12.2), req(1, 12.5, 15.0), req(2, 13.0, 17.0), req(3, 15.1, 20.0)]
    plan = LevelSchedule(num_requests=2, warmup_requests=1, cooldown_requests=1)
    levels = metrics.summarize_levels(requests, [], Slo(), plans={"b": plan})
    assert (levels[0].window_start_s, levels[0].window_end_s) == (2.5, 7.0)
    level = with_server_stats(levels, SAMPLES, requests)[0]
    assert level.server_preemptions == 2
    assert level.server_output_tokens == 220
    assert level.server_peak_kv_usage == 0.7
    # without the requests (no level start known) every read counts, as before
    assert with_server_stats(levels, SAMPLES)[0].server_preemptions == 9
