"""A bucket's ``protocol:`` (kvplan.workload.protocol): the lengths each client draws, by hand from
its source's formula; a load test of the bundled engine that sends exactly the protocol's counts
and lengths (counted in requests.csv) with the warm-up drained first; the simulation of the same
workload equal to that run at every step; and bad values as one line naming the key."""

import math
from pathlib import Path

import pytest
import yaml

from kvplan.results.run_result import load_run
from kvplan.results.stats.steady import request_index
from kvplan.run.loadtest import run_loadtest
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import replay_setup
from kvplan.workload.file import load_workload
from kvplan.workload.protocol import BenchProtocol
from tests.kvplan.cli_runner import run_cli

WORKLOAD = Path(__file__).resolve().parents[1] / "data" / "protocol.yaml"
PER, WARM = 4, 2  # the file's num_prompts_per_concurrency, warmup_per_concurrency


@pytest.mark.parametrize(
    ("kind", "ratio", "length", "low", "high"),
    [
        ("vllm_bench_serve", 0.25, 32, 24, 40),  # floor(32 x 0.75), ceil(32 x 1.25)
        ("vllm_bench_serve", 0.1, 1023, 920, 1126),  # floor(920.7), ceil(1125.3)
        ("vllm_bench_serve", 0.0, 128, 128, 128),
        ("vllm_bench_serve", 0.9, 1, 1, 2),  # floor(0.1) = 0 -> 1: no empty prompt or output
        ("inferencex", 0.8, 1024, 819, 1024),  # floor(819.2), L
        ("inferencex", 1.0, 8192, 8192, 8192),
    ],
)
def test_each_client_draws_lengths_from_its_own_range(kind, ratio, length, low, high):
    lengths = BenchProtocol(kind=kind, random_range_ratio=ratio).lengths(length)
    assert (lengths.min, lengths.max) == (low, high)
    assert lengths.dist == ("fixed" if low == high else "uniform")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return load_run(run_loadtest(load_workload(WORKLOAD), tmp_path_factory.mktemp("protocol") / "run"))


def test_the_load_test_sends_the_protocol_s_counts_and_lengths(measured):
    by_level = {}
    for r in measured.requests:
        by_level.setdefault(int(r.level), []).append(r)
    assert sorted(by_level) == [1, 4]
    for c, records in by_level.items():
        assert len(records) == (PER + WARM) * c  # requests.csv: every request sent, warm-ups too
        records.sort(key=request_index)
        warm, timed = records[: WARM * c], records[WARM * c :]
        first = timed[0]
        # the warm-ups are copies of the level's first measured prompt...
        assert {r.num_prompt_tokens for r in warm} == {first.num_prompt_tokens}
        # ...and all finish before the first measured request is sent; then c go together
        assert max(r.finish_time for r in warm) <= min(r.arrival_time for r in timed)
        wave = min(r.token_times[0] for r in timed)  # the first measured token: c were sent before it
        assert sum(r.arrival_time < wave for r in timed) == c
        assert all(24 <= r.num_prompt_tokens <= 40 and 6 <= r.num_output_tokens <= 10 for r in records)
    # the summaries count the measured requests only, with both mean and median of each latency
    for level in measured.result.levels:
        assert level.num_completed == PER * int(level.level)
        assert level.ttft_ms.count == PER * int(level.level)
        assert level.ttft_ms.mean > 0 and level.ttft_ms.p50 > 0
    assert "TTFT mean ms" in (measured.run_dir / "summary.md").read_text()
    # the lengths spread over the range (a uniform draw of 16 + 4 requests, not one length)
    assert len({r.num_prompt_tokens for r in measured.requests}) >= 5
    assert any(s.num_prefix_hit_tokens for s in measured.steps)  # the warm-ups' copies hit the cache
    assert any(s.num_preemptions for s in measured.steps)  # c=4 preempts on 40 blocks


def test_the_simulation_equals_the_protocol_run_at_every_step(measured, tmp_path):
    workload = load_workload(WORKLOAD)
    run = load_run(simulate(workload, replay_setup(workload, measured.run_dir), tmp_path / "sim", search=False))
    assert_same_run(run, measured)


def assert_same_run(run, measured):
    """A simulated run equals a measured one step for step (blocks, preemptions, queues, tokens,
    prefix hits), request for request and level for level."""
    fields = ("num_used_blocks", "num_preemptions", "num_running", "num_prefill_tokens", "num_decode_tokens")
    fields += ("kv_resident_request_ids", "num_prefix_hit_tokens", "num_waiting")
    assert len(run.steps) == len(measured.steps)
    for a, b in zip(run.steps, measured.steps):
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields], b.step_index
    shape = lambda rs: sorted((r.request_id, r.num_prompt_tokens, r.num_output_tokens) for r in rs)  # noqa: E731
    assert shape(run.requests) == shape(measured.requests)
    assert [lv.num_completed for lv in run.result.levels] == [lv.num_completed for lv in measured.result.levels]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kind": "genai_perf"}, "buckets[0].protocol.kind"),
        ({"random_range_ratio": 1.5}, "buckets[0].protocol"),
        ({"kind": "inferencex", "random_range_ratio": 0.0}, "buckets[0].protocol"),
        ({"num_prompts_per_concurrency": -1}, "buckets[0].protocol.num_prompts_per_concurrency"),
        ({"warmup_per_concurrency": -2}, "buckets[0].protocol.warmup_per_concurrency"),
        # 4 x 10^11 requests at c=4: once a 2.9 TiB MemoryError traceback while sampling lengths
        ({"num_prompts_per_concurrency": 10**11}, "buckets[0].protocol.num_prompts_per_concurrency: 400,000,000,000"),
        # 4 x 10^11 warm-ups at c=4: once simulated one by one (no end in sight)
        ({"warmup_per_concurrency": 10**11}, "protocol.warmup_per_concurrency: a level sends 400,000,000,016"),
    ],
)
def test_bad_protocol_values_are_one_line_naming_the_key(change, field, tmp_path):
    data = yaml.safe_load(WORKLOAD.read_text())
    data["buckets"][0]["protocol"].update(change)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    code, _, err = run_cli("simulate", str(path), "--out", str(tmp_path / "out"))
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in err, err


def test_a_protocol_refuses_what_it_would_override(tmp_path):
    from kvplan.errors import KvplanError
    from kvplan.workload.file import parse_workload

    data = yaml.safe_load(WORKLOAD.read_text())
    for change, says in (
        ({"input_tokens": [16, 32]}, "give input_tokens as L alone"),
        ({"request_rates": [5.0]}, "closed-loop levels only"),
        ({"num_requests": 3}, "drop num_requests"),
        ({"warmup": 2}, "drop duration_s, warmup and cooldown"),
    ):
        bad = {**data, "buckets": [{**data["buckets"][0], **change}]}
        with pytest.raises(KvplanError, match=says):
            parse_workload(bad)
    assert math.isclose(load_workload(WORKLOAD).buckets[0].num_requests, PER * 4)


def test_a_level_above_the_counts_per_unit_of_concurrency_runs_them_all(tmp_path):
    # 8 users, 4 + 2 requests per user: 48 sent (a level may exceed the per-unit counts, 6)
    data = yaml.safe_load(WORKLOAD.read_text())
    data["buckets"][0]["concurrency"] = [8]
    path = tmp_path / "eight.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "sim"))
    assert code == 0, err
    run = load_run(tmp_path / "sim")
    assert len(run.requests) == (PER + WARM) * 8
    assert [lv.num_completed for lv in run.result.levels] == [PER * 8]
