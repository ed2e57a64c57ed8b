"""KVCache: shapes, bytes per block by hand for SmolLM2's geometry, byte-budget sizing, fp8 scales."""

from __future__ import annotations

import pytest
import torch

from engine.kv_cache import KVCache, bytes_per_block_for

CPU = torch.device("cpu")
# SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64. Per token in bf16: 2 x 30 x 3 x 64 x 2 = 23,040 bytes.
SMOLLM2 = dict(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16)


def test_shapes_and_bytes_per_block_in_bf16_fp32_fp8():
    cache = KVCache(**SMOLLM2, dtype=torch.bfloat16, device=CPU, num_blocks=3)
    assert len(cache.k_caches) == len(cache.v_caches) == len(cache.layers) == 30
    assert cache.k_caches[0].shape == (3, 16, 3, 64) and cache.k_caches[0].dtype == torch.bfloat16
    assert cache.num_blocks == 3
    assert cache.bytes_per_block == 23_040 * 16 == 368_640
    assert cache.total_bytes == 3 * 368_640
    assert KVCache(**SMOLLM2, dtype=torch.float32, device=CPU, num_blocks=1).bytes_per_block == 46_080 * 16
    fp8 = KVCache(**SMOLLM2, dtype=torch.float8_e4m3fn, device=CPU, num_blocks=1)
    assert fp8.bytes_per_block == 11_520 * 16 and fp8.k_caches[0].dtype == torch.float8_e4m3fn
    assert bytes_per_block_for(30, 16, 3, 64, torch.bfloat16) == 368_640


def test_byte_budget_gives_whole_blocks():
    # 1,000,000 bytes / 368,640 per block = 2.7 -> 2 whole blocks.
    cache = KVCache(**SMOLLM2, dtype=torch.bfloat16, device=CPU, memory_bytes=1_000_000)
    assert cache.num_blocks == 2
    too_small = "kv_cache_memory_bytes: must hold at least one block of 368640 bytes"
    with pytest.raises(ValueError, match=too_small):
        KVCache(**SMOLLM2, dtype=torch.bfloat16, device=CPU, memory_bytes=368_639)
    with pytest.raises(ValueError, match="exactly one"):
        KVCache(**SMOLLM2, dtype=torch.bfloat16, device=CPU, num_blocks=2, memory_bytes=10**6)


def test_cache_starts_zeroed_and_scales_default_to_one():
    cache = KVCache(2, 2, 8, 4, torch.float32, CPU, num_blocks=5)
    assert all(not t.any() for t in (*cache.k_caches, *cache.v_caches))
    assert [(kv.k_scale, kv.v_scale) for kv in cache.layers] == [(1.0, 1.0), (1.0, 1.0)]


def test_set_scales_is_the_calibration_hook():
    cache = KVCache(2, 2, 8, 4, torch.float8_e4m3fn, CPU, num_blocks=5)
    cache.set_scales([0.5, 0.25], [2.0, 4.0])
    assert [(kv.k_scale, kv.v_scale) for kv in cache.layers] == [(0.5, 2.0), (0.25, 4.0)]
    assert cache.layers[1].k_cache is cache.k_caches[1]  # same tensors, new scales
    with pytest.raises(ValueError, match="one per layer"):
        cache.set_scales([1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="> 0"):
        cache.set_scales([1.0, 0.0], [1.0, 1.0])


def test_fp8_engine_stores_k_over_scale_within_e4m3_precision():
    """Layer 0's K/V depend only on the embeddings, so an fp32 cache and an fp8 cache filled by the
    same prompt must agree to e4m3's precision: 3 mantissa bits, relative rounding error <= 2^-4."""
    from engine.request import SamplingParams
    from tests.engine.tiny import random_prompts, tiny_engine

    prompt = random_prompts((11,))[0]
    exact = tiny_engine()
    exact.add_request(prompt, SamplingParams(max_tokens=1))
    exact.step()
    fp8 = tiny_engine(kv_cache_dtype="fp8")
    fp8.kv_cache.set_scales([0.05, 1.0], [0.02, 1.0])  # layer 0: stored values are k / 0.05, v / 0.02
    fp8.add_request(prompt, SamplingParams(max_tokens=1))
    fp8.step()
    for stored, scale, ref in (
        (fp8.kv_cache.k_caches[0], 0.05, exact.kv_cache.k_caches[0]),
        (fp8.kv_cache.v_caches[0], 0.02, exact.kv_cache.v_caches[0]),
    ):
        assert stored.dtype == torch.float8_e4m3fn
        assert ref.abs().sum() > 0  # the prompt's 11 slots were written
        torch.testing.assert_close(stored.float() * scale, ref, rtol=2**-4, atol=scale * 2**-9)
