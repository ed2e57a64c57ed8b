"""FP8 KV cache on the tiny model: calibrated scales against transformers' own K/V, the fp8 engine
against transformers with e4m3-rounded K/V, closeness to the fp32 engine, and bytes per block."""

from __future__ import annotations

import pytest
import torch

from engine.request import SamplingParams
from tests.engine.fp8_reference import E4M3Cache, hf_greedy_e4m3, hf_kv_amax, hf_logits
from tests.engine.tiny import random_prompts, tiny_engine, tiny_hf_model

CALIBRATION = random_prompts((11, 23, 40), seed=7)  # 11 and 23: partial last blocks of 4
PROMPTS = random_prompts((5, 9, 17, 30, 12, 21, 8, 40), seed=3)
GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def hf_model():
    return tiny_hf_model()


@pytest.fixture(scope="module")
def calibrated():
    """An fp8 engine calibrated on CALIBRATION, and the scales it returned."""
    engine = tiny_engine(kv_cache_dtype="fp8")
    return engine, engine.calibrate_kv_scales(CALIBRATION)


def test_scales_are_amax_over_448_of_transformers_k_after_rope_and_v(hf_model, calibrated):
    engine, scales = calibrated
    k_amax, v_amax = hf_kv_amax(hf_model, CALIBRATION)  # transformers' cache: K after RoPE, V
    assert scales.num_prompts == 3 and scales.num_tokens == 11 + 23 + 40
    # Our K/V and transformers' agree to fp32 rounding (~1e-7 relative), not bit for bit.
    assert scales.k_amax == pytest.approx(k_amax, rel=1e-5)
    assert scales.v_amax == pytest.approx(v_amax, rel=1e-5)
    assert scales.k_scales == pytest.approx([a / 448 for a in k_amax], rel=1e-5)
    assert scales.v_scales == pytest.approx([a / 448 for a in v_amax], rel=1e-5)
    # The scales are installed on the fp8 cache, layer by layer.
    assert [kv.k_scale for kv in engine.kv_cache.layers] == list(scales.k_scales)
    assert [kv.v_scale for kv in engine.kv_cache.layers] == list(scales.v_scales)
    assert all(not t.any() for t in engine.kv_cache.k_caches)  # the engine's own pool is untouched


def test_fp8_engine_equals_transformers_with_e4m3_rounded_kv(hf_model, calibrated):
    """With the same scales, transformers with every K/V rounded through e4m3 (E4M3Cache, none of
    our code) gives the same 16 greedy tokens as our fp8 engine on all 8 prompts: the fp8 path is
    exactly "the model with e4m3 K/V", with the scales applied on write and on read."""
    engine, scales = calibrated
    outputs = engine.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outputs):
        expected = hf_greedy_e4m3(hf_model, prompt, 16, scales.k_scales, scales.v_scales)
        assert list(out.output_token_ids) == expected


def test_fp8_engine_is_close_to_the_fp32_engine(calibrated):
    """Teacher-forced on each prompt + the fp32 engine's own 16 greedy tokens: KL(fp32 || fp8) per
    position stays below 1e-4 nats and both pick the same top-1 token at >= 90 % of positions
    (measured: 1.4e-5 at most, 98 %; an fp8 read that drops the K scale fails both).

    Greedy token equality with fp32 is not asserted here: the tiny random model's logits are nearly
    flat (|logit| < 0.7, median top-1 margin ~0.04) while e4m3's 3 mantissa bits move them by up to
    ~0.02, so greedy paths part at near-ties (2 of these 8 prompts). Exact greedy equality is
    asserted against transformers with e4m3 K/V above; SmolLM2's numbers come from the bench."""
    engine, _ = calibrated
    exact = tiny_engine()
    sequences = [p + list(o.output_token_ids) for p, o in zip(PROMPTS, exact.generate(PROMPTS, GREEDY))]
    score = [SamplingParams(max_tokens=1, num_prompt_logits=len(s)) for s in sequences]
    ref = torch.cat([o.prompt_logits for o in exact.generate(sequences, score)])
    fp8 = torch.cat([o.prompt_logits for o in engine.generate(sequences, score)])
    log_p, log_q = ref.double().log_softmax(-1), fp8.double().log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # KL(p || q) = sum p (ln p - ln q), per position
    assert kl.shape == (sum(map(len, sequences)),)
    assert kl.max().item() < 1e-4
    assert (ref.argmax(-1) == fp8.argmax(-1)).float().mean().item() >= 0.9
    assert not torch.equal(ref, fp8)  # the fp8 engine really rounds its K/V


def test_bytes_per_block_halve_against_bf16():
    # 2 (K, V) x 2 layers x block 4 x 2 KV heads x head_dim 16 x bytes per element.
    bf16 = tiny_engine(dtype="bfloat16")
    fp8 = tiny_engine(dtype="bfloat16", kv_cache_dtype="fp8")
    assert bf16.kv_cache_dtype == torch.bfloat16 and fp8.kv_cache_dtype == torch.float8_e4m3fn
    assert bf16.bytes_per_block == 2 * 2 * 4 * 2 * 16 * 2 == 1024
    assert fp8.bytes_per_block == 2 * 2 * 4 * 2 * 16 * 1 == 512
    assert fp8.kv_cache.total_bytes * 2 == bf16.kv_cache.total_bytes  # same 128 blocks


def test_calibration_input_errors():
    engine = tiny_engine(kv_cache_dtype="fp8", num_blocks=8)  # pool of 32 tokens
    with pytest.raises(ValueError, match="at least one non-empty prompt"):
        engine.calibrate_kv_scales([])
    with pytest.raises(ValueError, match=r"prompts\[1\]: every id must be in \[0, 512\)"):
        engine.calibrate_kv_scales([[5, 6], [5, 512]])
    engine.calibrate_kv_scales([[5] * 40])  # longer than the pool: the pass has its own cache
    with pytest.raises(ValueError, match=r"prompts\[0\]: 257 tokens > max_position_embeddings 256"):
        engine.calibrate_kv_scales([[5] * 257])
    engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="before the first step"):
        engine.calibrate_kv_scales([[5, 6, 7]])


def test_a_layer_of_zeros_keeps_scale_one():
    from engine.kv_scales import scale_from_amax

    assert scale_from_amax(0.0) == 1.0
    assert scale_from_amax(44.8) == pytest.approx(0.1)


def test_prompt_logits_path_with_fp8_matches_transformers_e4m3(hf_model, calibrated):
    """Scoring through the fp8 paged cache (chunked over several steps) gives transformers' logits
    with e4m3-rounded K/V: the teacher-forced KL of the quality check reads the real fp8 path."""
    _, scales = calibrated
    engine = tiny_engine(kv_cache_dtype="fp8", max_num_batched_tokens=8)
    engine.calibrate_kv_scales(CALIBRATION)
    prompt = PROMPTS[3]  # 30 tokens: 4 chunks of <= 8
    out = engine.generate([prompt], SamplingParams(max_tokens=1, num_prompt_logits=30))[0]
    expected = hf_logits(hf_model, prompt, E4M3Cache(scales.k_scales, scales.v_scales, hf_model.config))
    torch.testing.assert_close(out.prompt_logits, expected, rtol=0, atol=1e-5)
