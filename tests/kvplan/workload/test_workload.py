"""Workload YAML: the shipped files load, and every bad file gives one line naming the field."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.workload.file import load_workload, parse_workload
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[3]
BAD = Path(__file__).resolve().parents[1] / "data" / "bad_workloads"

# file -> the YAML path and problem its one-line error must name.
BAD_CASES = {
    "missing_field.yaml": "buckets[0].num_requests: required field missing",
    "wrong_type.yaml": "buckets[0].concurrency: must be a list (got 'four')",
    "negative_concurrency.yaml": "buckets[1].concurrency[1]: must be >= 1 (got -1)",
    "huge_num_requests.yaml": "buckets[0].num_requests: 400,000,000,000 requests per level is over the"
    " 10,000,000 kvplan samples; lower num_requests",
    "huge_warmup.yaml": "buckets[0].warmup: a level sends 100,000,000,008 requests (warm-up, measured and"
    " cool-down), over the 10,000,000 kvplan runs; lower warmup",
    "concurrency_over_requests.yaml": "buckets[0].concurrency[1]: 100 in flight needs at least 100 requests, the"
    " bucket has num_requests 8 (its measured knee would claim a level never"
    " reached); raise num_requests to >= 100 or drop the level",
    "empty_buckets.yaml": "buckets: must not be empty",
    "unknown_dataset.yaml": "dataset.kind: must be one of 'sharegpt', 'random', 'jsonl', 'trace' (got 'wikipedia')",
    "unreadable_dataset.yaml": "dataset.path: file not found:",
    "bad_units.yaml": "engine.kv_cache_memory: unknown unit; use B, KB, MB, GB, KiB, MiB or GiB (e.g. 48MiB)"
    " (got '48 parsecs')",
    "malformed.yaml": "malformed YAML: line 6, column 18: expected ',' or ']', but got ':'",
    "unknown_field.yaml": "buckets[0].concurency: unknown field",
    "dataset_unknown_key.yaml": "dataset.foo: unknown field; check the spelling or remove it (got 1)",
    "both_pool_sizes.yaml": "engine: give kv_cache_memory or num_blocks, not both",
    "inverted_range.yaml": "buckets[0].input_tokens: min must be <= max (got min 256, max 16)",
    "no_levels.yaml": "buckets[0]: give concurrency levels and/or request_rates",
    "not_a_mapping.yaml": "must be a YAML mapping (got list)",
    "sharegpt_without_tokenizer.yaml": "dataset: sharegpt needs a tokenizer and tiny-random-llama has none",
    "bad_dtype.yaml": "engine.dtype: must be one of 'auto', 'bfloat16', 'float16', 'float32' (got 'float64')",
    "duplicate_bucket.yaml": "buckets[1].name: duplicate name 'short'",
    "normal_without_std.yaml": "buckets[0].input_tokens: dist normal needs std (tokens)",
    "zero_rate.yaml": "buckets[0].request_rates[1]: must be > 0",
    # 1000 and 1000.0001 shared one level key, so one cache salt: the second level hit the first's blocks.
    "rates_alike.yaml": "buckets[0]: request_rates has levels that read alike as 1000 req/s ([1000.0, 1000.0001]);"
    " make them differ within 6 significant digits",
    "duplicate_key.yaml": "line 10: duplicate key 'name' (first at line 2); keep one of them",
    "negative_seed.yaml": "seed: must be >= 0 (got -1)",
    "huge_seed.yaml": "seed: must be <= 4294967295 (got 1180591620717411303424)",
    "infinite_rate.yaml": "buckets[0].request_rates[1]: must be a finite number (got inf)",
    # 4 / 1e-9 s; the lowest rate that arrives within 24 h: 4 / 86,400 s = 4.63e-05 req/s.
    "tiny_rate.yaml": "buckets[0].request_rates[0]: 4 requests at 1e-09 req/s take about 4e+09 s to arrive"
    " (num_requests / rate), over the 24 h a level may last; give a rate >= 4.63e-05 req/s",
    "out_of_range_memory.yaml": "engine.kv_cache_memory: the number is out of range (got '1e400GiB')",
    "jsonl_is_a_folder.yaml": f"dataset.path: is a folder, not a JSONL file: {BAD}; give the path of the .jsonl file",
    "long_name.yaml": "name: must be at most 200 characters (names become file names) (got 201 characters)",
    "bad_kv_cache_dtype.yaml": "engine.kv_cache_dtype: unknown dtype 'int8'; use one of auto, bf16, fp16, fp32, fp8",
    "both_kv_dtype_names.yaml": "plan[0]: give kv_cache_dtype only (kv_dtype is its deprecated name)",
    # steady-state levels
    "zero_duration.yaml": "buckets[0].duration_s: must be > 0.0 (got 0)",
    "warmup_over_duration.yaml": "buckets[0]: warmup (30s, 0) leaves nothing to measure in a 20 s level"
    " (duration_s); shorten them or lengthen duration_s",
    # 0.01 req/s x 10 s = 0.1 expected arrivals: the duration and the rate cannot both hold
    "duration_rate_conflict.yaml": "buckets[0].request_rates[0]: at 0.01 req/s a 10 s level (duration_s) expects"
    " 0.1 arrivals; give a rate >= 0.1 req/s or a longer duration_s",
    "bad_warmup.yaml": "buckets[0].warmup: '5 minutes' is neither a number of requests nor a time like 30s or 500ms",
    # open-loop arrival processes (kvplan.workload.arrivals)
    "arrival_unknown_process.yaml": "buckets[0].arrival.process: must be one of 'poisson', 'gamma', 'constant'"
    " (got 'bursty')",
    "arrival_zero_burstiness.yaml": "buckets[0].arrival.burstiness: must be > 0.0 (got 0)",
    "arrival_burstiness_without_gamma.yaml": "buckets[0].arrival.burstiness: applies to process gamma only (process"
    " is poisson); set process: gamma or drop burstiness",
    # request classes and engine variants (kvplan.traffic.mix, kvplan.workload.variants)
    "mix_zero_weights.yaml": "buckets[0].mix: the weights must sum to a positive number (got 0); give at least one"
    " class a weight > 0",
    "mix_beside_lengths.yaml": "buckets[0].input_tokens: a mix bucket takes its lengths from its classes; give"
    " input_tokens in each mix class",
    "missing_input_tokens.yaml": "buckets[0].input_tokens: required field missing; give a range, or a mix of classes",
    "variant_changes_model.yaml": "variants[0].engine.model: a variant runs the same token ids, so it cannot change"
    " the model",
    "variant_unknown_setting.yaml": "buckets[0].variants[0].engine.max_batch_tokens: unknown engine setting; give"
    " one of dtype, device, block_size,",
    "variant_bad_value.yaml": "variants[1].engine.max_num_batched_tokens: must be >= 1 (got 0)",
    "interference_without_mix.yaml": "buckets[0].interference: needs a mix: it runs each request class alone beside"
    " the mixed level; add a mix of classes or drop interference",
    "variant_with_shared_prefix.yaml": "variants: not supported with shared_prefix, which runs every level as its"
    " own cached and uncached variants",
}

# Refused by `kvplan loadtest` once the engine is built and prompts are sampled (the YAML is
# valid): file -> where the line starts (after "error: ") and what it says.
RUN_CASES = {
    "input_over_pool.yaml": (
        "input_over_pool.yaml",
        "buckets[0].input_tokens: the longest request (200 + 12 tokens)"
        " needs 53 blocks of 4 tokens, the KV pool has 48; lower it or grow engine.num_blocks",
    ),
    "output_over_pool.yaml": (
        "output_over_pool.yaml",
        "buckets[0].output_tokens: the longest request (12 + 300"
        " tokens) needs 78 blocks of 4 tokens, the KV pool has 48; lower it or grow"
        " engine.kv_cache_memory",
    ),
    "prefix_over_pool.yaml": (
        "prefix_over_pool.yaml",
        "shared_prefix.num_tokens: the longest request (prefix 200 +"
        " 12 + 12 tokens) needs 56 blocks of 4 tokens, the KV pool has 48",
    ),
    "over_max_model_len.yaml": (
        "over_max_model_len.yaml",
        "buckets[0].input_tokens: the longest request (20 + 12 ="
        " 32 tokens) exceeds engine.max_model_len 25; lower it or raise engine.max_model_len",
    ),
    "jsonl_ids_outside_vocab.yaml": (
        "ids_outside_vocab.jsonl",
        "line 2: prompt_token_ids: id 512 is outside the model's vocabulary [0, 512)",
    ),
    # the capacity estimate names the option `tp`; in a workload it is the entry's field
    "bad_plan_tp.yaml": (
        "bad_plan_tp.yaml",
        "plan[1].tp: 3 does not divide the 32 attention heads; pick a divisor of the head count",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_bad_workload_is_one_line_naming_the_field(name):
    path = BAD / name
    with pytest.raises(KvplanError) as caught:
        load_workload(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert BAD_CASES[name] in message
    assert "\n" not in message


@pytest.mark.parametrize("name", sorted(BAD_CASES) + sorted(RUN_CASES))
def test_kvplan_loadtest_on_a_bad_workload_exits_2_with_one_line(name, tmp_path):
    file, expected = RUN_CASES.get(name, (name, BAD_CASES.get(name)))
    code, out, err = run_cli("loadtest", str(BAD / name), "--out", str(tmp_path / "run"), "--quiet")
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {BAD / file}: ") and expected in lines[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", sorted(RUN_CASES))
def test_a_workload_refused_only_at_run_time_is_valid_yaml(name):
    assert load_workload(BAD / name).name == "bad"


def test_a_size_with_an_exponent_is_read_as_a_number():
    def memory(text):
        return parse_workload({**SMALL, "engine": {"kv_cache_memory": text}}).engine.kv_cache_memory

    assert memory("1e3MiB") == 1000 * 2**20 and memory("1.5e1KiB") == 15 * 1024
    with pytest.raises(KvplanError, match=r"engine\.kv_cache_memory: is out of range: at most 2\*\*63 - 1 bytes"):
        memory("1e10GiB")  # 1.07e19 bytes; torch sizes are int64


def test_a_number_with_an_exponent_in_the_yaml_is_a_float(tmp_path):
    """YAML 1.2 floats PyYAML's YAML 1.1 resolver reads as strings: was `slo.ttft_ms: must be a
    number (got '1.0e9')`."""
    path = tmp_path / "w.yaml"
    path.write_text(
        "name: w\ndataset: random\nslo: {ttft_ms: 1.0e9, tpot_ms: 2.5E1, e2e_ms: 3e+4}\nbuckets:\n"
        "  - {name: a, input_tokens: 8, output_tokens: 4, concurrency: [1], num_requests: 1}\n"
    )
    slo = load_workload(path).slo
    assert (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms) == (1_000_000_000.0, 25.0, 30_000.0)


def test_the_installed_command_prints_no_traceback():
    code = "from kvplan.cli import main; main()"
    missing = BAD / "missing_field.yaml"
    done = subprocess.run(
        [sys.executable, "-c", code, "loadtest", str(missing)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {missing}: buckets[0].num_requests: required field missing"
    assert "Traceback" not in done.stderr + done.stdout


def test_missing_workload_file():
    with pytest.raises(KvplanError, match=r"nope.yaml: cannot read workload file \(No such file or directory\)"):
        load_workload(BAD / "nope.yaml")


@pytest.mark.parametrize("name", ["smoke.yaml", "chat.yaml", "long_context.yaml", "sessions_offload.yaml"])
def test_shipped_workloads_load(name):
    workload = load_workload(ROOT / "workloads" / name)
    assert workload.name == name.removesuffix(".yaml")
    assert len(workload.sha256) == 64
    assert all(b.concurrency or b.request_rates for b in workload.buckets)


def test_sessions_offload_runs_its_sessions_without_and_with_a_host_tier():
    from kvplan.workload.variants import all_variants, variant_engine

    workload = load_workload(ROOT / "workloads" / "sessions_offload.yaml")
    assert workload.dataset.sessions is not None and workload.dataset.sessions.max_turns == 6
    assert workload.engine.enable_prefix_caching and not workload.engine.offload.is_on
    engines = {name: variant_engine(workload, v) for name, v in all_variants(workload).items()}
    assert engines["no-offload"].offload.host_gib is None
    assert engines["host-tier"].offload.host_gib == 0.5 and engines["host-tier"].num_blocks == 96
    # 8 users' histories of up to max_model_len tokens each outgrow the 96 x 16 = 1,536-token pool
    assert 8 * workload.engine.max_model_len > 96 * 16


SMALL = {
    "name": "w",
    "dataset": "random",
    "buckets": [{"name": "a", "input_tokens": 8, "output_tokens": 4, "concurrency": [1], "num_requests": 1}],
}


def test_shorthands_and_units():
    w = parse_workload(
        {
            "name": "w",
            "dataset": "random",
            "engine": {"kv_cache_memory": "1.5GiB", "block_size": 8},
            "buckets": [
                {"name": "a", "input_tokens": 128, "output_tokens": [16, 64], "concurrency": [1, 8], "num_requests": 8}
            ],
        }
    )
    assert w.engine.kv_cache_memory == 1.5 * 2**30
    assert (
        parse_workload({**w.model_dump(), "engine": {"kv_cache_memory": "48MiB"}}).engine.kv_cache_memory == 48 * 2**20
    )
    bucket = w.buckets[0]
    assert (bucket.input_tokens.min, bucket.input_tokens.max, bucket.input_tokens.dist) == (128, 128, "fixed")
    assert (bucket.output_tokens.min, bucket.output_tokens.max, bucket.output_tokens.dist) == (16, 64, "uniform")
    config = w.engine.to_engine_config(seed=5)
    assert (config.kv_cache_memory_bytes, config.block_size, config.seed) == (1.5 * 2**30, 8, 5)


def test_plan_kv_dtype_is_the_deprecated_name_of_kv_cache_dtype():
    plan = [{"model": "llama-3.1-8b", "gpu": "L4", "kv_dtype": "fp8"}, {"model": "llama-3.1-8b", "gpu": "L4"}]
    w = parse_workload({**SMALL, "plan": plan}, source="w.yaml")
    assert [t.kv_cache_dtype for t in w.plan] == ["fp8", "auto"]
    assert w.warnings == ("plan[0].kv_dtype: deprecated name; write kv_cache_dtype",)
    assert parse_workload({**SMALL, "plan": plan[1:]}).warnings == ()


def test_one_kv_dtype_vocabulary_for_the_engine_and_the_plan():
    w = parse_workload(
        {
            **SMALL,
            "engine": {"kv_cache_dtype": "bfloat16"},
            "plan": [{"model": "llama-3.1-8b", "gpu": "L4", "kv_cache_dtype": "float8_e4m3fn"}],
        }
    )
    assert (w.engine.kv_cache_dtype, w.plan[0].kv_cache_dtype) == ("bf16", "fp8")
    assert w.engine.to_engine_config(seed=0).kv_cache_dtype == "bfloat16"  # the engine keeps torch's name
    assert parse_workload({**SMALL, "engine": {"kv_cache_dtype": "fp8"}}).engine.kv_cache_dtype == "fp8"
    with pytest.raises(KvplanError, match=r"plan\[0\]\.kv_cache_dtype: unknown dtype 'fp6'; use one of auto, fp32"):
        parse_workload({**SMALL, "plan": [{"model": "m", "gpu": "L4", "kv_cache_dtype": "fp6"}]})


def test_engine_defaults_are_the_engines_own():
    from dataclasses import fields

    from engine.config import EngineConfig
    from kvplan.workload.schema import EngineSettings

    engine, settings = EngineConfig(), EngineSettings()
    shared = [f.name for f in fields(EngineConfig) if f.name in EngineSettings.model_fields]
    assert len(shared) == 11
    for name in shared:
        assert getattr(settings, name) == getattr(engine, name), name


def test_a_relative_plan_model_is_read_from_the_workload_files_folder(tmp_path, monkeypatch):
    import json

    from kvplan.run.estimate import plan_target

    (tmp_path / "models").mkdir()
    config = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "models" / "tiny.json").write_text(json.dumps(config))
    path = tmp_path / "w.yaml"
    path.write_text(json.dumps({**SMALL, "plan": [{"model": "models/tiny.json", "gpu": "L4"}]}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    target = plan_target(load_workload(path), 0, {"a": 100})
    assert target.bytes_per_token == 4 * 2 * 2 * 64 * 2  # layers x K,V x KV heads x head_dim x bf16
    assert target.model == "models/tiny.json"
    path.write_text(json.dumps({**SMALL, "plan": [{"model": "models/absent.json", "gpu": "L4"}]}))
    with pytest.raises(KvplanError) as caught:
        plan_target(load_workload(path), 0, {})
    assert str(caught.value) == f"{path}: plan[0].model: {tmp_path / 'models' / 'absent.json'}: no such file"


def test_a_plan_entrys_weight_dtype_sizes_its_kv_budget(tmp_path):
    """fp8 weights free one byte per parameter: Llama-3.1-8B's 8,030,261,248 (its model card's
    count) become KV blocks on the L4, 131,072 bytes per token (32 layers x K,V x 8 KV heads x
    128 x 2 bytes)."""
    from kvplan.run.estimate import plan_target

    path = tmp_path / "w.yaml"
    sized = {}
    for dtype in ("auto", " FP8 "):  # any case, spaces around it dropped
        path.write_text(json.dumps({**SMALL, "plan": [{"model": "llama-3.1-8b", "gpu": "L4", "weight_dtype": dtype}]}))
        sized[dtype] = plan_target(load_workload(path), 0, {"a": 100})
    assert sized[" FP8 "].weight_dtype == "fp8" and sized["auto"].weight_dtype == "auto"
    assert sized["auto"].bytes_per_token == sized[" FP8 "].bytes_per_token == 32 * 2 * 8 * 128 * 2
    freed = (sized[" FP8 "].kv_capacity_tokens - sized["auto"].kv_capacity_tokens) * 131_072
    assert abs(freed - 8_030_261_248) < 16 * 131_072  # within one block of 16 tokens
    path.write_text(json.dumps({**SMALL, "plan": [{"model": "llama-3.1-8b", "gpu": "L4", "weight_dtype": "fp7"}]}))
    with pytest.raises(KvplanError) as caught:
        load_workload(path)
    assert str(caught.value).startswith(f"{path}: plan[0].weight_dtype: unknown dtype 'fp7'; use one of auto, ")


def test_an_empty_variants_list_is_said_not_read_silently():
    """variants: [] names no variant (the levels run once, on the engine section); a bucket's own []
    under the workload's variants runs that bucket without them. Both are read so, and said."""
    plain = parse_workload({**SMALL, "variants": []})
    assert plain.variants == [] and plain.warnings == (
        "variants: [] names no variant: every level runs once, on the engine section as it is",
    )
    two = [{"name": "a1", "engine": {"max_num_seqs": 2}}, {"name": "a2", "engine": {"max_num_seqs": 4}}]
    bucket = {**SMALL["buckets"][0], "variants": []}
    mixed = parse_workload({**SMALL, "variants": two, "buckets": [bucket, {**bucket, "name": "b", "variants": None}]})
    assert mixed.warnings == (
        "buckets[0].variants: [] runs this bucket on the engine section alone, without the workload's variants",
    )
    assert parse_workload({**SMALL, "variants": two}).warnings == ()
