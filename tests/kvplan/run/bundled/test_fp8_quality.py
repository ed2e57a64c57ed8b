"""The fp8 quality check: its measures on hand-made inputs, its numbers on the tiny model against
transformers with e4m3-rounded K/V, bytes per block (engine and estimate), and the load test's
fp8 hooks (calibration in the run metadata, the check in results.json and summary.md)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.config import EngineConfig
from kvplan.errors import KvplanError
from kvplan.results.run_result import read_result
from kvplan.run.bundled.fp8_quality import (
    Fp8Quality,
    QualityPrompt,
    greedy_agreement,
    kl_divergence,
    leading_agreement,
    random_quality_prompts,
    run_fp8_quality,
)
from kvplan.workload.file import parse_workload
from tests.engine.fp8_reference import E4M3Cache, hf_greedy_e4m3, hf_kv_amax, hf_logits
from tests.engine.tiny import TINY, hf_greedy, random_prompts, tiny_engine, tiny_hf_model


# ---- the measures on hand-made inputs ------------------------------------------------------------
def test_kl_of_identical_distributions_is_zero():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 0.0, 0.0]])
    assert kl_divergence(logits, logits).tolist() == [0.0, 0.0]
    assert kl_divergence(logits, logits + 3.0).abs().max().item() < 1e-15  # softmax ignores a shift


def test_kl_by_hand():
    # p = (1/2, 1/2), q = (1/4, 3/4): 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3) = 0.143841036...
    # p = (0.7, 0.2, 0.1), q = (0.6, 0.3, 0.1): 0.7 ln(7/6) + 0.2 ln(2/3) + 0
    #   = 0.7 x 0.1541506798 - 0.2 x 0.4054651081 = 0.1079054759 - 0.0810930216 = 0.0268124543
    p = torch.tensor([[0.5, 0.5, 1e-300], [0.7, 0.2, 0.1]], dtype=torch.float64).log()
    q = torch.tensor([[0.25, 0.75, 1e-300], [0.6, 0.3, 0.1]], dtype=torch.float64).log()
    kl = kl_divergence(p, q).tolist()
    assert kl == pytest.approx([0.5 * math.log(4 / 3), 0.0268124543], rel=1e-8)
    assert kl[0] == pytest.approx(0.1438410362, rel=1e-9)
    assert kl_divergence(q, p)[0].item() != pytest.approx(kl[0])  # KL is not symmetric


def test_agreement_counts_only_up_to_the_first_divergence():
    reference = [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    candidate = [[1, 2, 3, 4], [1, 2, 9, 4], [0, 6, 7, 8], [9, 9, 9, 9, 7]]
    assert leading_agreement([1, 2, 9, 4], [1, 2, 3, 4]) == 2  # position 3 agrees again: not counted
    agreement = greedy_agreement(reference, candidate, num_tokens=4)
    assert agreement.first_divergence == (4, 2, 0, 4)  # a fifth token past num_tokens is ignored
    assert agreement.prefix_agreement == (4 + 2 + 0 + 4) / 16 == 0.625
    assert agreement.exact_match_rate == 2 / 4
    with pytest.raises(ValueError, match="equally many"):
        greedy_agreement(reference, candidate[:3], 4)


# ---- bytes per block: the engine's tensors and kvplan's estimate ----------------------------------
def test_bytes_per_block_halve_in_the_engine_and_in_kvplans_estimate():
    from engine.kv_cache import KVCache
    from kvplan.sizing.kv_math import bytes_per_token
    from kvplan.sizing.models.model_source import load_model_spec
    from kvplan.sizing.models.model_spec import ModelSpec

    for kv_dtype, engine_dtype, per_block in (("bf16", "bfloat16", 1024), ("fp8", "fp8", 512)):
        engine = tiny_engine(dtype="bfloat16", kv_cache_dtype=engine_dtype)
        spec = ModelSpec.from_hf_config(engine.hf_config.to_dict(), name=TINY)
        # 2 x 2 layers x 2 KV heads x head_dim 16 x (2 or 1 bytes) per token, x block size 4.
        assert engine.bytes_per_block == per_block == bytes_per_token(spec, kv_dtype) * 4
    # SmolLM2-135M (preset): 2 x 30 x 3 x 64 x 1 = 11,520 bytes per token in fp8, half of bf16's 23,040.
    smollm2 = load_model_spec("smollm2-135m")
    assert bytes_per_token(smollm2, "fp8") == 11_520 and bytes_per_token(smollm2, "bf16") == 23_040
    cache = KVCache(30, 3, 64, 16, torch.float8_e4m3fn, torch.device("cpu"), num_blocks=1)
    assert cache.bytes_per_block == 16 * 11_520 == 184_320


# ---- the check on the tiny model, against transformers with e4m3-rounded K/V --------------------
def test_quality_numbers_equal_transformers_with_e4m3_kv():
    """run_fp8_quality's numbers, recomputed without our engine: transformers in fp32 for the
    reference; transformers with K/V rounded through e4m3 at scales amax / 448 (amax read from
    transformers' own cache over the calibration prompts) for fp8."""
    num_tokens = 8
    prompts = random_quality_prompts(512, 6, num_tokens, max_prompt_tokens=24, seed=5)
    calibration = random_prompts((20, 33), seed=9)
    config = EngineConfig(
        model=TINY, dtype="float32", device="cpu", attention_backend="torch", block_size=4, num_blocks=128
    )
    quality = run_fp8_quality(config, prompts, calibration, num_tokens, "random")
    assert isinstance(quality, Fp8Quality) and quality.num_prompts == 6 and quality.num_kl_positions == 48

    hf = tiny_hf_model()
    k_amax, v_amax = hf_kv_amax(hf, calibration)
    k_scales, v_scales = [a / 448 for a in k_amax], [a / 448 for a in v_amax]
    divergence, kls, same_top1 = [], [], 0
    for p in prompts:
        ref_tokens = hf_greedy(hf, list(p.prompt_token_ids), num_tokens, ignore_eos=True)
        fp8_tokens = hf_greedy_e4m3(hf, list(p.prompt_token_ids), num_tokens, k_scales, v_scales)
        divergence.append(next((i for i, (a, b) in enumerate(zip(ref_tokens, fp8_tokens)) if a != b), num_tokens))
        seq = list(p.prompt_token_ids + p.reply_token_ids[:-1])
        rows = slice(len(p.prompt_token_ids) - 1, None)  # the logits predicting each reply token
        ref = hf_logits(hf, seq)[rows].double().log_softmax(-1)
        fp8 = hf_logits(hf, seq, E4M3Cache(k_scales, v_scales, hf.config))[rows].double().log_softmax(-1)
        assert ref.shape[0] == num_tokens
        kls.append((ref.exp() * (ref - fp8)).sum(-1))
        same_top1 += int((ref.argmax(-1) == fp8.argmax(-1)).sum())
    kl = torch.cat(kls)
    assert quality.mean_first_divergence == sum(divergence) / 6
    assert quality.prefix_agreement == sum(divergence) / (6 * num_tokens)
    assert quality.exact_match_rate == sum(d == num_tokens for d in divergence) / 6
    assert quality.top1_agreement == same_top1 / 48
    assert quality.mean_kl == pytest.approx(kl.mean().item(), rel=1e-3)
    assert quality.max_kl == pytest.approx(kl.max().item(), rel=1e-3)
    assert 0 < quality.mean_kl < 1e-4


def test_random_quality_prompts_have_fixed_reply_length():
    prompts = random_quality_prompts(512, 5, 7, max_prompt_tokens=10, seed=1)
    assert [len(p.reply_token_ids) for p in prompts] == [7] * 5
    assert all(1 <= len(p.prompt_token_ids) <= 10 for p in prompts)
    assert prompts == random_quality_prompts(512, 5, 7, max_prompt_tokens=10, seed=1)
    assert isinstance(prompts[0], QualityPrompt)


# ---- the load test's hooks -----------------------------------------------------------------------
FP8_WORKLOAD = {
    "name": "fp8-tiny",
    "seed": 3,
    "engine": {
        "model": TINY,
        "dtype": "float32",
        "block_size": 4,
        "num_blocks": 64,
        "kv_cache_dtype": "fp8",
        "enable_prefix_caching": False,
    },
    "dataset": "random",
    "buckets": [{"name": "short", "input_tokens": [12, 20], "output_tokens": 6, "concurrency": [4], "num_requests": 4}],
    "fp8_quality": {"num_calibration_prompts": 2, "num_prompts": 5, "num_tokens": 6},
}


def test_fp8_load_test_records_calibration_and_the_check(tmp_path):
    from kvplan.run.loadtest import run_loadtest
    from kvplan.traffic.prompts import sample_buckets

    workload = parse_workload(FP8_WORKLOAD)
    run_dir = run_loadtest(workload, tmp_path / "run")
    result = read_result(run_dir)
    engine = result.engine
    assert engine.kv_cache_dtype == "fp8" and engine.bytes_per_block == 2 * 2 * 4 * 2 * 16 * 1 == 512
    assert result.estimate.bytes_per_block == 512  # kvplan's estimate prices fp8 at 1 byte

    # Calibrated on the first 2 of the run's own prompts: scales = transformers' amax / 448 (the
    # tiny model's weights are drawn from the engine seed, the workload's seed 3).
    first_two = [list(r.prompt_token_ids) for r in sample_buckets(workload, None, 512).requests["short"][:2]]
    k_amax, v_amax = hf_kv_amax(tiny_hf_model(seed=3), first_two)
    scales = engine.kv_scales
    assert scales.num_calibration_prompts == 2
    assert scales.num_calibration_tokens == sum(map(len, first_two))
    assert scales.k_scales == pytest.approx([a / 448 for a in k_amax], rel=1e-5)
    assert scales.v_scales == pytest.approx([a / 448 for a in v_amax], rel=1e-5)

    quality = result.fp8_quality
    assert (quality.num_prompts, quality.num_tokens, quality.num_kl_positions) == (5, 6, 30)
    assert quality.num_calibration_prompts == 2 and quality.prompts.startswith("random token ids")
    assert 0 <= quality.prefix_agreement <= 1 and 0 < quality.mean_kl < 1e-4
    summary = (run_dir / "summary.md").read_text()
    assert "## FP8 KV cache (e4m3)" in summary
    assert "calibrated on 2 of this run's prompts" in summary
    assert f"| teacher-forced top-1 agreement | {quality.top1_agreement:.3g} |" in summary


def test_bad_fp8_quality_settings_name_the_field():
    with pytest.raises(KvplanError, match=r"fp8_quality\.num_prompts: must be >= 0"):
        parse_workload({**FP8_WORKLOAD, "fp8_quality": {"num_prompts": -1}})
    with pytest.raises(KvplanError, match=r"fp8_quality\.num_calibration_prompts: must be >= 1"):
        parse_workload({**FP8_WORKLOAD, "fp8_quality": {"num_calibration_prompts": 0}})


def test_a_check_that_cannot_run_fails_before_the_load_test(tmp_path):
    from kvplan.run.loadtest import run_loadtest

    # 64 blocks of 4: max_model_len 256, so 300 reply tokens leave no room for a prompt.
    workload = parse_workload({**FP8_WORKLOAD, "fp8_quality": {"num_tokens": 300}})
    with pytest.raises(KvplanError, match=r"fp8_quality\.num_tokens: must be < max_model_len 256 \(got 300\)"):
        run_loadtest(workload, tmp_path / "run")
    assert not (tmp_path / "run" / "steps.jsonl").exists()


def test_ctrl_c_during_calibration_leaves_no_run_folder(tmp_path, monkeypatch):
    # The folder used to appear before calibration, holding only workload.yaml: `kvplan report`
    # could not read it and the same --out was refused as not empty.
    import kvplan.run.bundled.fp8_quality
    from kvplan.run.loadtest import run_loadtest

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(kvplan.run.bundled.fp8_quality, "calibrate_for_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_loadtest(parse_workload(FP8_WORKLOAD), tmp_path / "run")
    assert not (tmp_path / "run").exists()
