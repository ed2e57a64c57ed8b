"""Layers that are not alike, priced layer by layer: the cases of
tests/kvplan/data/estimate_layer_kinds/ (copied from ../shared/cases/estimate_layer_kinds/, README
there) through `kvplan estimate --json`, then one hand-built config per layer kind, a mixed model
at 4k and 128k, and the fixed per-request state of recurrent layers. Every expected value is
written out as arithmetic: (layers) x (K + V widths) x KV heads x bytes, and vLLM's state shapes
(``MambaStateShapeCalculator``) for the states."""

import json
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.sizing import kv_math
from kvplan.sizing.models.model_spec import ModelSpec
from tests.kvplan.cli_runner import run_cli

CASES = Path(__file__).resolve().parents[1] / "data" / "estimate_layer_kinds"


def estimate_json(*args: str) -> dict:
    code, out, err = run_cli("estimate", *args, "--json")
    assert (code, err) == (0, ""), err
    return json.loads(out)


def gdn_state_bytes(k_heads, v_heads, k_dim, v_dim, kernel, conv_bytes=2, recurrent_bytes=2, tp=1):
    """vLLM's gated_delta_net_state_shape: conv (kernel - 1, (2 k_heads k_dim + v_heads v_dim) / tp),
    recurrent (v_heads / tp, v_dim, k_dim)."""
    conv = (kernel - 1) * (2 * k_heads * k_dim + v_heads * v_dim) // tp
    return conv * conv_bytes + v_heads // tp * v_dim * k_dim * recurrent_bytes


# ---- the five case files ---------------------------------------------------------------------


def test_qwen3_next_prices_12_attention_layers_and_36_linear_states():
    result = estimate_json("--model", str(CASES / "hybrid_qwen3_next.config.json"), "--max-model-len", "4096")
    # full_attention_interval 4: layers 3, 7, ..., 47 are full attention, 2 KV heads x 256, bf16
    assert result["bytes_per_token"] == 12 * 2 * 2 * 256 * 2 == 24_576  # not 48 x ... = 98,304
    assert result["layer_kind_counts"] == {"linear": 36, "full": 12}
    # 36 Gated DeltaNet layers: conv (3, 2 x 16 x 128 + 32 x 128 = 8192), recurrent (32, 128, 128), bf16
    state = 36 * ((4 - 1) * 8192 * 2 + 32 * 128 * 128 * 2)
    assert state == 36 * 1_097_728 == 39_518_208 == gdn_state_bytes(16, 32, 128, 128, 4) * 36
    assert result["per_request_state_bytes"] == state
    assert result["state_dtype"] == {"conv": "bf16", "recurrent": "bf16"}
    assert result["per_request_bytes"] == 4096 * 24_576 + state  # one 4k request: its KV and its state
    assert sum(layer["bytes_per_token"] for layer in result["layers"]) == result["bytes_per_token"]
    assert sum(layer["state_bytes"] for layer in result["layers"]) == state


def test_lfm2_layer_types_price_6_attention_layers_and_10_conv_states():
    result = estimate_json("--model", str(CASES / "lfm2_layer_types_conv.config.json"), "--max-model-len", "4096")
    assert result["bytes_per_token"] == 6 * 2 * 8 * 64 * 2 == 12_288  # not 16 layers: 32,768
    assert result["layer_kind_counts"] == {"conv": 10, "full": 6}
    # vLLM's short_conv_state_shape(hidden_size, conv_L_cache): (3 - 1, 2048) per conv layer, bf16
    assert result["per_request_state_bytes"] == 10 * (3 - 1) * 2048 * 2 == 81_920
    assert result["state_dtype"] == {"conv": "bf16"}


def test_lfm2_gguf_reads_the_per_layer_kv_head_array():
    result = estimate_json("--model", str(CASES / "gguf_lfm2_per_layer_head_count_kv.gguf"), "--max-model-len", "4096")
    # head_count_kv [0, 0, 8, 0, 0, 8, 0, 0, 8, 0, 8, 0, 8, 0, 8, 0]: 6 attention layers, f16 cache
    assert result["bytes_per_token"] == 6 * 2 * 8 * (2048 // 32) * 2 == 12_288
    assert result["kv_cache_dtype"] == "fp16"  # llama.cpp's default cache type, not bf16
    # the file names no shortconv.l_cache: transformers' default 3 sizes the 10 conv states (fp16)
    assert result["per_request_state_bytes"] == 10 * 2 * 2048 * 2 == 81_920


def test_gguf_key_and_value_lengths_are_priced_apart():
    result = estimate_json("--model", str(CASES / "gguf_key192_value128.gguf"), "--max-model-len", "4096")
    assert result["bytes_per_token"] == 32 * 8 * (192 + 128) * 2 == 163_840  # not V at K's width: 196,608
    assert result["kv_cache_dtype"] == "fp16"
    assert {(layer["k_head_dim"], layer["v_head_dim"]) for layer in result["layers"]} == {(192, 128)}


def test_meta_params_json_reads_n_kv_heads():
    result = estimate_json("--model", str(CASES / "meta_params_llama3_8b_n_kv_heads.json"), "--max-model-len", "8192")
    assert result["bytes_per_token"] == 32 * 2 * 8 * (4096 // 32) * 2 == 131_072  # not 32 KV heads: 524,288
    # Meta's FeedForward width: int(2 x 4 x 4096 / 3) = 10922, x 1.3 = 14198, up to a multiple of 1024
    assert (
        result["num_parameters"]
        == 2 * 128_256 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14_336 + 2 * 4096) + 4096
    )


# ---- one hand-built config per layer kind ------------------------------------------------------

BASE = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_size": 512,
    "max_position_embeddings": 262_144,
    "torch_dtype": "bfloat16",
}


def spec(**changes) -> ModelSpec:
    return ModelSpec.from_hf_config({**BASE, **changes}, "hand-built")


def test_full_attention():
    layers = kv_math.rank_layer_specs(spec())
    assert kv_math.layers_bytes_per_token(layers) == 4 * 2 * 64 * 2 * 2 == 2048
    assert kv_math.request_bytes(layers, 1000) == 1000 * 2048 and kv_math.request_state_bytes(layers) == 0


def test_sliding_window_layers_hold_their_window():
    s = spec(sliding_window=64, layer_types=["sliding_attention", "full_attention"] * 2)
    layers = kv_math.rank_layer_specs(s)
    # 2 full layers hold 1000 tokens, 2 sliding layers the last 64; 512 bytes per token per layer
    assert kv_math.request_bytes(layers, 1000) == (2 * 1000 + 2 * 64) * 512


def test_chunked_attention_holds_at_most_a_chunk():
    s = spec(attention_chunk_size=128, layer_types=["chunked_attention"] * 3 + ["full_attention"])
    assert kv_math.request_bytes(kv_math.rank_layer_specs(s), 1000) == (3 * 128 + 1000) * 512


def test_mla_caches_one_latent():
    s = spec(model_type="deepseek_v3", kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
    assert kv_math.bytes_per_token(s) == 4 * (512 + 64) * 2 == 4608
    assert kv_math.bytes_per_token(s, tp=8) == 4608  # replicated, not split


def test_gated_delta_net_state_with_tensor_parallelism():
    linear = dict(
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=32,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
    )
    s = spec(**linear)
    layers = kv_math.rank_layer_specs(s)
    assert kv_math.layers_bytes_per_token(layers) == 1 * 2 * 64 * 2 * 2  # the one full layer
    # conv (3, 2 x 4 x 32 + 8 x 16 = 384), recurrent (8, 16, 32), bf16; three layers
    assert (
        kv_math.request_state_bytes(layers)
        == 3 * (3 * 384 * 2 + 8 * 16 * 32 * 2)
        == 3 * gdn_state_bytes(4, 8, 32, 16, 4)
    )
    # tp=2 halves the channels and the value heads (vLLM's divide)
    halved = kv_math.rank_layer_specs(s, tp=2)
    assert (
        kv_math.request_state_bytes(halved)
        == 3 * (3 * 192 * 2 + 4 * 16 * 32 * 2)
        == 3 * gdn_state_bytes(4, 8, 32, 16, 4, tp=2)
    )
    with pytest.raises(KvplanError, match="^tp: 16 does not divide the 8 linear-attention value heads"):
        kv_math.rank_layer_specs(spec(**linear, num_attention_heads=16, num_key_value_heads=16), tp=16)
    # a config naming mamba_ssm_dtype float32 (Qwen3.5) keeps the recurrent state in fp32
    fp32 = kv_math.rank_layer_specs(spec(**linear, mamba_ssm_dtype="float32"))
    assert kv_math.request_state_bytes(fp32) == 3 * gdn_state_bytes(4, 8, 32, 16, 4, recurrent_bytes=4)


def test_conv_state():
    s = spec(model_type="lfm2", layer_types=["conv", "full_attention", "conv", "conv"], conv_L_cache=3)
    # vLLM's short_conv_state_shape: (conv_L_cache - 1, hidden_size / tp)
    assert kv_math.request_state_bytes(kv_math.rank_layer_specs(s)) == 3 * 2 * 512 * 2
    assert kv_math.request_state_bytes(kv_math.rank_layer_specs(s, tp=2)) == 3 * 2 * 256 * 2


def test_mamba2_state_pads_groups_across_ranks():
    mamba = dict(
        model_type="granitemoehybrid",
        layer_types=["mamba", "attention", "mamba", "mamba"],
        mamba_n_heads=16,
        mamba_d_head=64,
        mamba_d_state=128,
        mamba_n_groups=1,
        mamba_d_conv=4,
        mamba_expand=2,
    )
    s = spec(**mamba)
    assert s.layer_kinds == ("mamba", "full", "mamba", "mamba")
    # vLLM's mamba2_state_shape: conv (3, 1024 + 2 x 1 x 128), recurrent (16, 64, 128), bf16
    assert kv_math.request_state_bytes(kv_math.rank_layer_specs(s)) == 3 * (3 * (1024 + 256) * 2 + 16 * 64 * 128 * 2)
    # tp=2: one group does not split, so it becomes 2 (one per rank): conv (3, (1024 + 2 x 2 x 128) / 2)
    assert kv_math.request_state_bytes(kv_math.rank_layer_specs(s, tp=2)) == 3 * (3 * 768 * 2 + 8 * 64 * 128 * 2)


def test_mamba1_state_in_a_jamba_pattern():
    s = spec(
        model_type="jamba", attn_layer_period=2, attn_layer_offset=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2
    )
    assert s.layer_kinds == ("mamba", "full", "mamba", "full")
    # vLLM's mamba1_state_shape: conv (3, 2 x 512), recurrent (2 x 512, 16), bf16
    assert kv_math.request_state_bytes(kv_math.rank_layer_specs(s)) == 2 * (3 * 1024 * 2 + 1024 * 16 * 2)


def test_parallel_hybrid_holds_kv_and_state_in_every_layer():
    s = spec(
        model_type="falcon_h1",
        mamba_d_ssm=1024,
        mamba_n_heads=16,
        mamba_d_head=64,
        mamba_n_groups=1,
        mamba_d_state=16,
        mamba_d_conv=4,
    )
    layers = kv_math.rank_layer_specs(s)
    assert kv_math.layers_bytes_per_token(layers) == 4 * 2 * 64 * 2 * 2
    assert kv_math.request_state_bytes(layers) == 4 * (3 * (1024 + 2 * 16) * 2 + 16 * 64 * 16 * 2)


def test_nemotron_h_pattern():
    s = spec(
        model_type="nemotron_h",
        hybrid_override_pattern="M-M*",
        mamba_num_heads=8,
        mamba_head_dim=64,
        ssm_state_size=128,
        n_groups=2,
        conv_kernel=4,
    )
    assert s.layer_kinds == ("mamba", "none", "mamba", "full")
    layers = kv_math.rank_layer_specs(s)
    assert kv_math.layers_bytes_per_token(layers) == 2 * 64 * 2 * 2
    # conv (3, 8 x 64 + 2 x 2 x 128) in bf16; recurrent (8, 64, 128) in fp32, vLLM's NemotronH default
    assert kv_math.request_state_bytes(layers) == 2 * (3 * (512 + 512) * 2 + 8 * 64 * 128 * 4)


def test_per_layer_kv_heads_and_layers_without_attention():
    s = spec(num_key_value_heads=[2, 4, 0, 8])  # a per-layer list, 0: no attention in that layer
    assert s.layer_kinds == ("full", "full", "none", "full")
    assert kv_math.bytes_per_token(s) == (2 + 4 + 8) * 2 * 64 * 2
    with pytest.raises(KvplanError, match="field num_key_value_heads must list one number per layer, 4 \\(got 3\\)"):
        spec(num_key_value_heads=[2, 4, 8])


def test_k_and_v_of_different_widths():
    assert kv_math.bytes_per_token(spec(head_dim=192, v_head_dim=128)) == 4 * 2 * (192 + 128) * 2


def test_global_and_sliding_layers_of_different_shapes_and_shared_kv_layers():
    """Gemma 4 style: sliding layers use head_dim and num_key_value_heads, full layers
    global_head_dim and num_global_key_value_heads; the last num_kv_shared_layers reuse an
    earlier layer's KV (Gemma 3n, Gemma 4) and hold none."""
    s = spec(
        model_type="gemma4_text",
        num_hidden_layers=6,
        sliding_window=512,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        num_global_key_value_heads=1,
        global_head_dim=512,
        num_kv_shared_layers=2,
    )
    assert s.layer_kinds == ("sliding", "sliding", "full", "sliding", "none", "none")
    per_token = 3 * 2 * (64 + 64) * 2 + 1 * 1 * (512 + 512) * 2
    assert kv_math.bytes_per_token(s) == per_token
    # at 4096 tokens: 3 sliding layers hold 512 tokens, the full layer all 4096
    assert kv_math.request_bytes(kv_math.rank_layer_specs(s), 4096) == 3 * 512 * 512 + 4096 * 2048


def test_a_mixed_model_at_4k_and_128k_by_hand():
    """8 layers: 2 full and 4 sliding (window 1024), 4 KV heads x 128, and 2 Gated DeltaNet layers;
    bf16. Per attention layer and token: 4 x (128 + 128) x 2 = 2048 bytes."""
    mixed = {
        **BASE,
        "model_type": "mixed",
        "num_hidden_layers": 8,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_attention_heads": 16,
        "sliding_window": 1024,
        "layer_types": [
            "sliding_attention",
            "linear_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "linear_attention",
            "sliding_attention",
            "full_attention",
        ],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
    }
    state = 2 * (3 * (2 * 2 * 64 + 4 * 64) * 2 + 4 * 64 * 64 * 2)  # 2 x 35,840
    at_4k = 2 * 4096 * 2048 + 4 * 1024 * 2048 + state
    at_128k = 2 * 131_072 * 2048 + 4 * 1024 * 2048 + state
    assert (state, at_4k, at_128k) == (71_680, 25_237_504, 545_331_200)
    layers = kv_math.rank_layer_specs(ModelSpec.from_hf_config(mixed, "mixed"))
    assert kv_math.request_bytes(layers, 4096) == at_4k
    assert kv_math.request_bytes(layers, 131_072) == at_128k


def test_the_mixed_model_through_the_cli(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                **BASE,
                "model_type": "qwen3_next",
                "num_hidden_layers": 8,
                "full_attention_interval": 4,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 4,
                "linear_key_head_dim": 64,
                "linear_value_head_dim": 64,
            }
        )
    )
    grid = estimate_json("--model", str(config), "--context", "4k,128k", "--kv-memory-gib", "1")["grid"]
    state = 6 * (3 * 512 * 2 + 4 * 64 * 64 * 2)  # layers 0-2 and 4-6 are linear (interval 4)
    assert [row["kv_bytes"] for row in grid] == [2 * 4096 * 512 + state, 2 * 131_072 * 512 + state]
    assert [row["fits"] for row in grid] == [True, True]  # 1 GiB holds 128 MiB of KV and the state


# ---- errors name the keys of the file read ---------------------------------------------------


def write_gguf(path: Path, arch: str, **values) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in values.items():
        key = f"{arch}.{key.replace('__', '.')}"
        writer.add_array(key, value) if isinstance(value, list) else writer.add_uint32(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_errors_name_the_gguf_key(tmp_path):
    bad = write_gguf(
        tmp_path / "v0.gguf",
        "llama",
        block_count=2,
        embedding_length=64,
        attention__head_count=4,
        attention__head_count_kv=2,
        attention__key_length=16,
        attention__value_length=0,
    )
    code, out, err = run_cli("estimate", "--model", str(bad))
    assert (code, out) == (2, "")
    assert err == f"error: {bad}: field llama.attention.value_length must be a whole number >= 1 (got 0)\n"
    mla = write_gguf(tmp_path / "mla.gguf", "deepseek2", block_count=2, embedding_length=64, attention__head_count=4)
    code, out, err = run_cli("estimate", "--model", str(mla))
    assert err.startswith(f"error: {mla}: missing field deepseek2.attention.kv_lora_rank; deepseek2 attention (MLA)")


def test_gguf_layer_patterns_follow_llama_cpp(tmp_path):
    # gemma3: set_swa_pattern(6), every 6th layer global; window 1024
    gemma = write_gguf(
        tmp_path / "g.gguf",
        "gemma3",
        block_count=12,
        embedding_length=256,
        attention__head_count=4,
        attention__head_count_kv=1,
        attention__key_length=64,
        attention__value_length=64,
        attention__sliding_window=1024,
        context_length=8192,
    )
    kinds = [layer["kind"] for layer in estimate_json("--model", str(gemma))["layers"]]
    assert kinds == ["sliding"] * 5 + ["full"] + ["sliding"] * 5 + ["full"]
    # Qwen3-Next in GGUF: the ssm keys carry the linear-attention sizes (convert_hf_to_gguf.py)
    nxt = write_gguf(
        tmp_path / "n.gguf",
        "qwen3next",
        block_count=8,
        embedding_length=256,
        attention__head_count=4,
        attention__head_count_kv=2,
        attention__key_length=64,
        attention__value_length=64,
        context_length=8192,
        full_attention_interval=4,
        ssm__conv_kernel=4,
        ssm__state_size=32,
        ssm__group_count=4,
        ssm__time_step_rank=8,
        ssm__inner_size=8 * 16,
    )
    result = estimate_json("--model", str(nxt), "--max-model-len", "1024")
    assert result["layer_kind_counts"] == {"linear": 6, "full": 2}
    assert result["per_request_state_bytes"] == 6 * gdn_state_bytes(4, 8, 32, 16, 4)  # f16: 2 bytes too


def test_meta_params_errors_name_meta_keys(tmp_path):
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 3, "vocab_size": 128_256}))
    code, out, err = run_cli("estimate", "--model", str(tmp_path))  # a folder holding params.json
    assert err == (
        f"error: {params}: field n_kv_heads (3) must divide n_heads (32); "
        "grouped-query attention gives each KV head a whole group of query heads\n"
    )
