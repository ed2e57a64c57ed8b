"""KV formulas against hand arithmetic: the worked examples of issue 2, dtypes, tp/pp, windows, MLA."""

import pytest

from kvplan.errors import KvplanError
from kvplan.sizing import kv_math
from kvplan.sizing.dtypes import DTYPES as KV_DTYPES
from kvplan.sizing.kv_math import FullAttentionSpec, MLASpec, SlidingWindowSpec
from kvplan.sizing.models.model_spec import ModelSpec

GiB = 2**30
BF16, FP16 = KV_DTYPES["bf16"], KV_DTYPES["fp16"]


def model(num_layers=32, heads=32, kv_heads=8, head_dim=128, dtype="bfloat16", **extra):
    config = dict(num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=kv_heads)
    config.update(head_dim=head_dim, torch_dtype=dtype, **extra)
    return ModelSpec.from_hf_config(config, "test-model")


def test_worked_example_32_layers_8_kv_heads_bf16():
    layers = (FullAttentionSpec(8, 128, BF16),) * 32
    # 2 (K, V) x 32 layers x 8 heads x 128 x 2 bytes
    assert kv_math.layers_bytes_per_token(layers) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv_math.request_kv_bytes(layers, 8 * 1024) == 1 * GiB
    assert kv_math.request_kv_bytes(layers, 32 * 1024) == 4 * GiB
    assert kv_math.request_kv_bytes(layers, 128 * 1024) == 16 * GiB
    assert kv_math.batch_kv_bytes(layers, 32 * 1024, 8, block_size=16) == 32 * GiB


def test_llama2_7b_mha_fp16_and_40_layer_mha():
    llama2 = model(num_layers=32, heads=32, kv_heads=32, head_dim=None, hidden_size=4096, dtype="float16")
    assert kv_math.bytes_per_token(llama2) == 524_288
    assert kv_math.request_kv_bytes(kv_math.rank_layer_specs(llama2), 4096) == 2 * GiB
    mha40 = model(num_layers=40, heads=32, kv_heads=32, head_dim=None, hidden_size=4096, dtype="float16")
    assert kv_math.bytes_per_token(mha40) == 655_360  # 2 x 40 x 4096 x 2
    assert kv_math.request_kv_bytes(kv_math.rank_layer_specs(mha40), 4096) == int(2.5 * GiB)


@pytest.mark.parametrize(
    "kv_dtype, expected",
    [
        ("fp32", 262_144),  # 32 x 2 x 8 x 128 x 4
        ("fp16", 131_072),
        ("bf16", 131_072),
        ("auto", 131_072),  # the config's bfloat16
        ("fp8", 65_536),  # 1 byte, one scale per layer tensor
        ("int8", 32 * 2 * 32 * 34),  # rows of 8 x 128 = 1024 values = 32 groups of (32 B + 2 B scale)
        ("int4", 32 * 2 * 32 * 18),  # 32 groups of (16 B + 2 B scale)
    ],
)
def test_kv_dtypes_with_scale_overhead(kv_dtype, expected):
    assert kv_math.bytes_per_token(model(), kv_dtype) == expected


def test_auto_dtype_serves_float32_checkpoints_in_fp16():
    assert kv_math.kv_dtype_of(model(dtype="float32")).name == "fp16"
    assert kv_math.kv_dtype_of(model(dtype="float16")).name == "fp16"
    assert kv_math.kv_dtype_of(model(dtype="bfloat16")).name == "bf16"
    assert kv_math.kv_dtype_of(model(dtype="float32"), "bfloat16").name == "bf16"  # torch's name, one vocabulary
    with pytest.raises(KvplanError, match="kv_cache_dtype: unknown dtype 'fp6'"):
        kv_math.kv_dtype_of(model(), "fp6")


def test_tp_splits_kv_heads_and_replicates_below_one():
    llama70b = model(num_layers=80, heads=64, kv_heads=8)
    assert kv_math.bytes_per_token(llama70b, tp=1) == 80 * 2 * 8 * 128 * 2
    assert kv_math.bytes_per_token(llama70b, tp=4) == 80 * 2 * 2 * 128 * 2
    # 8 KV heads over 32 ranks: each rank keeps one (replicated), not a quarter
    assert kv_math.bytes_per_token(llama70b, tp=32) == 80 * 2 * 1 * 128 * 2 == 40_960


def test_tp_that_does_not_divide_heads_is_an_error():
    with pytest.raises(KvplanError, match="tp: 3 does not divide the 64 attention heads"):
        kv_math.bytes_per_token(model(num_layers=80, heads=64, kv_heads=8), tp=3)
    with pytest.raises(KvplanError, match="tp: must be >= 1"):
        kv_math.bytes_per_token(model(), tp=0)


def test_pp_splits_layers_and_the_largest_stage_limits():
    # 30 layers over 4 stages: 7, 8, 8, 7 (the extras go to the stages before the last)
    assert [len(s) for s in kv_math.pipeline_stages(30, 4)] == [7, 8, 8, 7]
    smol = model(num_layers=30, heads=9, kv_heads=3, head_dim=64)
    assert kv_math.bytes_per_token(smol, pp=4) == 8 * 2 * 3 * 64 * 2
    with pytest.raises(KvplanError, match="pp"):
        kv_math.bytes_per_token(smol, pp=31)


def test_mla_caches_one_latent_not_split_by_tp():
    deepseek_v3 = model(
        num_layers=61,
        heads=128,
        kv_heads=128,
        head_dim=None,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
    )
    assert kv_math.bytes_per_token(deepseek_v3) == 61 * (512 + 64) * 2 == 70_272
    assert kv_math.bytes_per_token(deepseek_v3, tp=8) == 70_272


def test_sliding_window_layer_holds_at_most_the_window():
    window = SlidingWindowSpec(16, 128, BF16, sliding_window=1024)
    assert window.tokens_held(4096) == 1024
    assert window.tokens_held(100) == 100
    # paged: the window [3976, 5000) touches blocks 3976 // 16 = 248 .. 4999 // 16 = 312
    assert window.blocks_held(5000, 16) == range(248, 313)
    assert window.blocks_held(4096, 16) == range(192, 256)


def test_block_rounding_and_paged_waste():
    layers = (FullAttentionSpec(8, 128, BF16),) * 32
    # 1000 tokens need 63 blocks of 16 (1008 slots): 8 empty slots x 131,072 bytes wasted
    assert kv_math.request_kv_bytes(layers, 1000, 16) == 63 * 16 * 131_072
    assert kv_math.request_kv_bytes(layers, 1000, 16) - kv_math.request_kv_bytes(layers, 1000) == 8 * 131_072


def test_shared_prefix_full_blocks_count_once():
    layers = (FullAttentionSpec(8, 128, BF16),) * 2  # 8,192 bytes per token, 131,072 per block of 16
    # 4 requests of 100 tokens sharing a 40-token prefix: 2 full prefix blocks stored once
    per_request = 7 * 16 * 8192  # ceil(100 / 16) = 7 blocks
    shared = 2 * 16 * 8192
    assert kv_math.batch_kv_bytes(layers, 100, 4, 16, prefix_tokens=40) == 4 * per_request - 3 * shared
    # a sliding layer that moved past the prefix no longer holds it
    window = (SlidingWindowSpec(8, 128, BF16, sliding_window=32),)
    assert kv_math.shared_prefix_bytes(window, 100, 40, 16) == 0
    assert kv_math.shared_prefix_bytes(window, 40, 40, 16) == 2 * 16 * 4096


def test_mla_spec_shapes():
    assert MLASpec(512, 64, BF16).bytes_per_token == 1152
    assert MLASpec(512, 64, FP16).tokens_held(7) == 7
