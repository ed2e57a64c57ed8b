"""What a simulation reads without the engine equals what the engine reads: the engine facts
(KV pool, block bytes, max_model_len, model dims), the tokenizer's ids and so the sampled
requests; and a sampled workload is cached once and read back the same."""

from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.run.bundled.backend import build_engine, engine_facts, tokenizer_function
from kvplan.run.sim.facts import simulated_facts
from kvplan.traffic import samples
from kvplan.traffic.prompts import sample_buckets
from kvplan.traffic.tokenizer import tokenize_function, tokenizer_identity
from kvplan.workload.file import load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[4]
FACT_FIELDS = (
    "model",
    "dtype",
    "kv_cache_dtype",
    "block_size",
    "num_blocks",
    "bytes_per_block",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "seed",
    "num_layers",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
)


def assert_same_facts(workload):
    engine = build_engine(workload)
    built, simulated = engine_facts(engine), simulated_facts(workload, "cpu", "torch")
    for field in FACT_FIELDS:
        assert getattr(simulated, field) == getattr(built, field), field
    return engine


@pytest.mark.parametrize("name", ["smoke.yaml", "ci.yaml"])
def test_tiny_model_facts_equal_the_built_engines(name):
    assert_same_facts(load_workload(ROOT / "workloads" / name))


def test_pool_by_memory_and_fp8_kv_equal_the_built_engines():
    base = {
        "name": "x",
        "dataset": "random",
        "buckets": [{"name": "b", "input_tokens": 8, "output_tokens": 8, "concurrency": [1], "num_requests": 1}],
    }
    for engine in (
        {"model": "tiny-random-llama", "kv_cache_memory": "100KiB", "dtype": "float32"},
        {"model": "tiny-random-llama", "kv_cache_memory": "100KiB", "kv_cache_dtype": "fp8"},
        {"model": "tiny-random-llama", "num_blocks": 7, "block_size": 8},
    ):
        assert_same_facts(parse_workload({**base, "engine": engine}))


def test_settings_the_engine_refuses_are_refused_by_field():
    base = {
        "name": "x",
        "dataset": "random",
        "buckets": [{"name": "b", "input_tokens": 8, "output_tokens": 8, "concurrency": [1], "num_requests": 1}],
    }
    with pytest.raises(KvplanError, match="engine.max_model_len: must be <= the model's max_position_embeddings 256"):
        simulated_facts(
            parse_workload({**base, "engine": {"model": "tiny-random-llama", "max_model_len": 512}}), "cpu", "torch"
        )
    with pytest.raises(KvplanError, match="engine.kv_cache_memory: 100 bytes hold not one block"):
        simulated_facts(
            parse_workload({**base, "engine": {"model": "tiny-random-llama", "kv_cache_memory": "100B"}}),
            "cpu",
            "torch",
        )


@pytest.mark.smollm2
def test_smollm2_chat_yaml_facts_and_sampled_requests_equal_the_engines():
    workload = load_workload(ROOT / "workloads" / "chat.yaml")
    engine = assert_same_facts(workload)
    by_engine = sample_buckets(workload, tokenizer_function(engine), engine.hf_config.vocab_size)
    ours = sample_buckets(workload, tokenize_function(workload.engine.model), engine.hf_config.vocab_size)
    assert ours.requests == by_engine.requests  # same prompts, same token ids, same lengths and order
    texts = [
        "What is the capital of France? Answer in one sentence.",
        "<|im_start|>user\nhi<|im_end|>\n",
        "naïve café — 東京 😀\ttabs  and   spaces\n\n",
    ]
    assert tokenize_function(workload.engine.model)(texts) == tokenizer_function(engine)(texts)


def test_a_sample_is_cached_once_and_read_back_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv(samples.CACHE_ENV, str(tmp_path))
    workload = load_workload(ROOT / "tests" / "kvplan" / "data" / "sim_exact.yaml")
    calls = []

    def counting(texts):
        calls.append(len(texts))
        return [[1] * 12 for _ in texts]

    first = samples.cached_sample(workload, lambda: counting, 512, ["x"])
    assert first == sample_buckets(workload, counting, 512)  # random prompts are drawn, never cached
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text("".join(f'{{"prompt": "text {i}", "output_tokens": 6}}\n' for i in range(20)))
    data = workload.model_dump(mode="json")
    data.update(dataset={"jsonl": str(jsonl)}, shared_prefix=None)
    from_file = parse_workload(data, source=str(tmp_path / "w.yaml"))
    calls.clear()
    first = samples.cached_sample(from_file, lambda: counting, 512, ["x"])
    assert calls and len(list((tmp_path / "samples").glob("*.json"))) == 1
    calls.clear()
    again = samples.cached_sample(from_file, lambda: counting, 512, ["x"])
    assert again == first and calls == []  # read back, nothing tokenised
    other = samples.cached_sample(from_file, lambda: counting, 512, ["another tokenizer"])
    assert other == first and calls and len(list((tmp_path / "samples").glob("*.json"))) == 2


def test_the_tiny_model_has_no_tokenizer():
    assert tokenize_function("tiny-random-llama") is None and tokenizer_identity("tiny-random-llama") == []
