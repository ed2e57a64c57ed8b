"""Mixture-of-experts steps priced as they run, and the 4-bit floating point weight dtypes, by
hand: a made-up 2-layer MoE of 8 experts, top-2, on a made-up GPU."""

from dataclasses import dataclass

import pytest

from kvplan.errors import KvplanError
from kvplan.run.sim.cost import StepWork
from kvplan.sizing import dtypes
from kvplan.sizing.gpus.gpu_perf import GpuPerf, ServingFit
from kvplan.sizing.gpus.step_cost import roofline
from kvplan.sizing.models.model_source import load_preset
from kvplan.sizing.models.model_spec import ModelSpec
from kvplan.sizing.models.weights import count_parameters, routed_expert_parameters, weights_bytes
from tests.kvplan.sizing.test_step_cost import TINY

MOE = {
    "model_type": "qwen3_moe",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# per layer: q, o 64 x 64; k, v 64 x 32; 2 norms of 64; 8 experts of 3 x 64 x 32; router 64 x 8
EXPERT = 3 * 64 * 32
PER_LAYER = 2 * 64 * 64 + 2 * 64 * 32 + 2 * 64 + 8 * EXPERT + 64 * 8
OTHER = 2 * PER_LAYER + 64  # + the final norm
EMBEDDING = 2 * 512 * 64
ACTIVE = OTHER - 2 * (8 - 2) * EXPERT  # 2 MoE layers, 6 of 8 experts idle per token
ALL_WEIGHTS = (OTHER + EMBEDDING) * 2  # bf16
EVERY_STEP = ALL_WEIGHTS - 2 * 8 * EXPERT * 2  # all but the 16 routed experts
KV = 2 * 2 * 2 * 16 * 2  # K and V x layers x KV heads x head_dim x bf16
ACTIVATIONS = 2 * (6 * 64 + 3 * 128) * 2  # layers x (6 hidden + 3 intermediate) x bf16
GPU = GpuPerf("test", bf16_flops=1e12, fp8_flops=2e12, hbm_bytes_per_s=1e9, link_bytes_per_s=1e8, source="made up")
FIT = ServingFit(compute_efficiency=0.5, memory_efficiency=0.8, step_overhead_s=0.001)


@dataclass(frozen=True)
class _Gpu:
    """GpuPerf's figures with an FP4 peak, whether or not GpuPerf has the field yet."""

    bf16_flops: float = 1e12
    fp8_flops: float | None = 2e12
    hbm_bytes_per_s: float = 1e9
    link_bytes_per_s: float = 1e8
    fp4_flops: float | None = 4e12


def _spec(**changes) -> ModelSpec:
    return ModelSpec.from_hf_config({**MOE, **changes}, "tiny-moe")


def test_the_config_gives_top_k_and_the_expert_sizes():
    spec = _spec()
    assert spec.moe is not None and spec.moe.experts_per_token == 2 and spec.moe.num_experts == 8
    assert count_parameters(spec) == (EMBEDDING, OTHER)
    assert routed_expert_parameters(spec) == EXPERT
    assert _spec(num_experts_per_tok=None).moe.experts_per_token == 0  # not given
    with pytest.raises(KvplanError, match="num_experts_per_tok"):
        _spec(num_experts_per_tok=9)  # more than the 8 experts


def test_expected_distinct_experts_hit_by_a_step():
    cost = roofline(_spec(), GPU, FIT)
    assert (cost.moe_layers, cost.num_experts, cost.experts_per_token) == (2, 8, 2)
    # 8 x (1 - (1 - 2/8)^T): no token reads none, one reads its 2, two read 3.5 on average
    assert cost.experts_hit(0) == 0
    assert cost.experts_hit(1) == 2
    assert cost.experts_hit(2) == pytest.approx(8 * (1 - 0.75**2)) == 3.5
    assert cost.experts_hit(10_000) == 8  # a long prefill reads every expert


def test_one_decode_token_reads_its_top_k_experts_and_runs_the_active_parameters():
    cost = roofline(_spec(), GPU, FIT)
    assert cost.flops_per_token == 2 * ACTIVE
    assert cost.weight_bytes == EVERY_STEP and cost.expert_bytes == EXPERT * 2
    work = StepWork(
        num_prefill_tokens=0, num_decode_tokens=1, num_prefill_seqs=0, num_context_tokens=10, num_attended_tokens=10
    )
    moved = EVERY_STEP + 2 * 2 * EXPERT * 2 + KV * 11 + ACTIVATIONS  # 2 layers x 2 experts x bf16
    flops = 2 * ACTIVE + 2 * 512 * 64 + 4 * 4 * 16 * 2 * 10
    parts = cost.parts(work)
    assert parts["memory_s"] == pytest.approx(moved / 1e9)
    assert parts["compute_s"] == pytest.approx(flops / 1e12)
    assert cost.step_seconds(work) == pytest.approx(max(flops / 0.5e12, moved / 0.8e9) + 0.001)


def test_a_long_prefill_reads_every_weight_once():
    cost = roofline(_spec(), GPU, FIT)
    work = StepWork(
        num_prefill_tokens=200,
        num_decode_tokens=0,
        num_prefill_seqs=1,
        num_context_tokens=200,
        num_attended_tokens=200 * 201 // 2,
    )
    # 0.75^200 = 1e-25: all 8 experts of both layers read
    assert cost.parts(work)["memory_s"] == pytest.approx((ALL_WEIGHTS + KV * 400 + ACTIVATIONS * 200) / 1e9)
    flops = 2 * ACTIVE * 200 + 2 * 512 * 64 + 4 * 4 * 16 * 2 * work.num_attended_tokens
    assert cost.parts(work)["compute_s"] == pytest.approx(flops / 1e12)


def test_experts_split_over_tensor_parallel_ranks():
    one, two = roofline(_spec(), GPU, FIT), roofline(_spec(), GPU, FIT, tp=2)
    assert two.expert_bytes == one.expert_bytes / 2 and two.weight_bytes == one.weight_bytes / 2
    assert two.flops_per_token == one.flops_per_token / 2 and two.experts_hit(1) == one.experts_hit(1)


def test_without_top_k_every_expert_counts_as_before():
    cost = roofline(_spec(num_experts_per_tok=None), GPU, FIT)
    assert cost.flops_per_token == 2 * OTHER
    assert cost.experts_hit(1) == 8
    work = StepWork(0, 1, 0, 10, 10)
    assert cost.parts(work)["memory_s"] == pytest.approx((ALL_WEIGHTS + KV * 11 + ACTIVATIONS) / 1e9)


def test_shared_experts_run_for_every_token():
    # DeepSeek style: 1 shared expert of the expert size, never routed
    cost = roofline(_spec(n_shared_experts=1), GPU, FIT)
    assert cost.flops_per_token == 2 * (ACTIVE + 2 * EXPERT)
    assert cost.weight_bytes == EVERY_STEP + 2 * EXPERT * 2


TINY_DENSE = TINY  # the dense config of test_step_cost.py


def test_a_dense_step_is_priced_as_before():
    cost = roofline(ModelSpec.from_hf_config(TINY_DENSE, "tiny"), GPU, FIT)
    assert (cost.moe_layers, cost.num_experts, cost.experts_per_token, cost.expert_bytes) == (0, 0, 0, 0)
    # weights 2 x (74,048 + 65,536) = 279,168 B, + 256 x 11 K/V + 3,072 activations = 285,056 B;
    # / (1e9 x 0.8) = 356.32 us, above the compute (218,752 FLOPs / 0.5e12); + 1 ms overhead
    assert cost.step_seconds(StepWork(0, 1, 0, 10, 10)) == pytest.approx(0.00135632, rel=1e-12)


def test_fp4_weight_dtypes_count_their_block_scales():
    assert dtypes.canonical_weight("FP4") == "nvfp4" and dtypes.canonical_weight("mxfp4") == "mxfp4"
    assert dtypes.FP4_WEIGHT_DTYPES["nvfp4"].bits_per_weight == 4.5  # 4 + 8 / 16
    assert dtypes.FP4_WEIGHT_DTYPES["mxfp4"].bits_per_weight == 4.25  # 4 + 8 / 32
    assert dtypes.weight_bytes_per_element("int4") == 0.5  # as before: group scales left out
    spec = ModelSpec.from_hf_config(TINY_DENSE, "tiny")
    params = 74_048 + 65_536
    assert weights_bytes(spec, "nvfp4") == int(params * 4.5 / 8)
    assert weights_bytes(spec, "fp4") == weights_bytes(spec, "nvfp4")
    assert weights_bytes(spec, "mxfp4") == int(params * 4.25 / 8)
    assert weights_bytes(spec, "int4") == params // 2
    with pytest.raises(KvplanError, match="unknown dtype 'nvfp5'"):
        weights_bytes(spec, "nvfp5")


def test_fp4_is_not_a_kv_dtype():
    with pytest.raises(KvplanError, match="unknown dtype 'nvfp4'"):
        dtypes.canonical("nvfp4")
    with pytest.raises(KvplanError, match="unknown dtype 'fp4'"):
        dtypes.canonical("fp4", "kv_cache_dtype")


def test_fp4_weights_run_at_the_fp4_peak_else_fp8_else_bf16():
    spec = ModelSpec.from_hf_config(TINY_DENSE, "tiny")
    assert roofline(spec, _Gpu(), FIT, weight_dtype="nvfp4").peak_flops == 4e12
    assert roofline(spec, _Gpu(), FIT, weight_dtype="mxfp4").peak_flops == 4e12
    assert roofline(spec, _Gpu(fp4_flops=None), FIT, weight_dtype="nvfp4").peak_flops == 2e12
    assert roofline(spec, GPU, FIT, weight_dtype="fp4").peak_flops == 2e12  # a GpuPerf without an FP4 peak
    assert roofline(spec, _Gpu(fp4_flops=None, fp8_flops=None), FIT, weight_dtype="mxfp4").peak_flops == 1e12
    assert roofline(spec, _Gpu(), FIT, weight_dtype="int4").peak_flops == 1e12  # W4A16: BF16 math
    assert roofline(spec, _Gpu(), FIT, weight_dtype="fp8").peak_flops == 2e12
    assert roofline(spec, _Gpu(), FIT).peak_flops == 1e12
    nvfp4 = ModelSpec.from_hf_config(
        {**TINY_DENSE, "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, "tiny-nvfp4"
    )
    assert nvfp4.weight_bits == 4.5
    assert roofline(nvfp4, _Gpu(), FIT).peak_flops == 4e12


def test_an_mxfp4_checkpoint_keeps_its_bits_with_auto():
    spec, _ = load_preset("gpt-oss-120b")
    assert spec.weight_bits == 4.25 and spec.moe is not None and spec.moe.experts_per_token == 4
    embedding, other = count_parameters(spec)
    assert weights_bytes(spec) == int(embedding * 2 + other * 4.25 / 8)  # embeddings stay bf16
    assert weights_bytes(spec, "mxfp4") == int((embedding + other) * 4.25 / 8)
    cost = roofline(spec, _Gpu(), FIT)
    assert cost.peak_flops == 4e12
    # one decode token reads 4 of 128 experts in each of 36 layers
    per_expert = routed_expert_parameters(spec) * 4.25 / 8
    assert cost.expert_bytes == per_expert and cost.experts_hit(1) == pytest.approx(4)
    assert cost.weight_bytes == pytest.approx(weights_bytes(spec) - 36 * 128 * per_expert)


@pytest.mark.parametrize(
    "preset, active_billions, embedding_share",
    [
        ("mixtral-8x7b", 12.9, 1),  # Mistral AI: 12.9B active of 46.7B
        ("qwen3-30b-a3b", 3.3, 1),  # Qwen3 model card: 3.3B activated of 30.5B
        ("qwen3-235b-a22b", 22, 1),  # Qwen3 model card: 22B activated of 235B
        ("deepseek-v3", 37, 1),  # DeepSeek-V3 report: 37B activated of 671B
        ("gpt-oss-120b", 5.1, 0.5),  # OpenAI model card: 5.13B active, the unembedding counted
    ],
)
def test_active_parameters_of_known_moe_models(preset, active_billions, embedding_share):
    """Published active counts include the embedding and LM head (gpt-oss's: the LM head only);
    within 3 %."""
    spec, _ = load_preset(preset)
    embedding, _other = count_parameters(spec)
    active = roofline(spec, GPU, FIT).flops_per_token / 2 + embedding * embedding_share
    assert active / 1e9 == pytest.approx(active_billions, rel=0.03)
