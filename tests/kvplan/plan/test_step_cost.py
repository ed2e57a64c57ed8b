"""The roofline step-time model by hand: FLOPs, bytes and link traffic of a step of a tiny Llama
on a made-up GPU, and the GPU speed table's lookups and refusals."""

import pytest

from kvplan.errors import KvplanError
from kvplan.load.sim.cost import StepWork
from kvplan.plan.gpu_perf import GpuPerf, ServingFit, lookup_gpu_perf, serving_fit
from kvplan.plan.model_spec import ModelSpec
from kvplan.plan.step_cost import ALLREDUCE_LATENCY_S, roofline

TINY = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# per layer: q and o 64 x 64 each, k and v 64 x 32 each, gate/up/down 64 x 128 each, 2 norms of 64
PER_LAYER = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
OTHER = 2 * PER_LAYER + 64  # + the final norm
EMBEDDING = 2 * 512 * 64  # untied input and output embeddings
GPU = GpuPerf("test", bf16_flops=1e12, fp8_flops=2e12, hbm_bytes_per_s=1e9, link_bytes_per_s=1e8, source="made up")
FIT = ServingFit(compute_efficiency=0.5, memory_efficiency=0.8, step_overhead_s=0.001)


def test_one_gpu_step_by_hand():
    cost = roofline(ModelSpec.from_hf_config(TINY, "tiny"), GPU, FIT)
    assert cost.flops_per_token == 2 * OTHER
    assert cost.weight_bytes == (OTHER + EMBEDDING) * 2
    assert cost.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2  # K and V x layers x KV heads x head_dim x bf16
    # 3 decoding requests with 10, 20 and 30 tokens of context, one 8-token prefill chunk after 4 cached
    work = StepWork(
        num_prefill_tokens=8,
        num_decode_tokens=3,
        num_prefill_seqs=1,
        num_context_tokens=10 + 20 + 30 + 12,
        num_attended_tokens=10 + 20 + 30 + 8 * 4 + 36,
    )
    flops = 2 * OTHER * 11 + 2 * 512 * 64 * 4 + 4 * 4 * 16 * 2 * work.num_attended_tokens
    moved = (OTHER + EMBEDDING) * 2 + 256 * (72 + 11) + 11 * 2 * (6 * 64 + 3 * 128) * 2
    parts = cost.parts(work)
    assert parts["compute_s"] == pytest.approx(flops / 1e12)
    assert parts["memory_s"] == pytest.approx(moved / 1e9)
    assert parts["link_s"] == 0
    assert cost.step_seconds(work) == pytest.approx(max(flops / 0.5e12, moved / 0.8e9) + 0.001)


def test_tensor_parallel_splits_the_work_and_pays_the_link():
    spec = ModelSpec.from_hf_config(TINY, "tiny")
    one, two = roofline(spec, GPU, FIT), roofline(spec, GPU, FIT, tp=2)
    assert two.flops_per_token == one.flops_per_token / 2 and two.weight_bytes == one.weight_bytes / 2
    assert two.kv_bytes_per_token == one.kv_bytes_per_token / 2  # one KV head of 2 per rank
    work = StepWork(0, 4, 0, 40, 40)
    # 2 layers x 2 all-reduces of 4 tokens x 64 x 2 bytes; a ring moves 2 x (2 - 1) / 2 of it per rank
    link = 2 * 2 * 4 * 64 * 2 * 2 * (2 - 1) / 2
    assert two.parts(work)["link_s"] == pytest.approx(link / 1e8 + 4 * ALLREDUCE_LATENCY_S)


def test_fp8_weights_run_at_the_fp8_peak():
    spec = ModelSpec.from_hf_config(TINY, "tiny")
    assert roofline(spec, GPU, FIT, weight_dtype="fp8").peak_flops == 2e12
    assert roofline(spec, GPU, FIT).peak_flops == 1e12
    no_fp8 = GpuPerf("old", 1e12, None, 1e9, 1e8, "made up")
    assert roofline(spec, no_fp8, FIT, weight_dtype="fp8").peak_flops == 1e12


def test_gpu_speeds_resolve_through_the_gpu_table():
    h100 = lookup_gpu_perf("h100 sxm")
    assert (h100.name, h100.bf16_flops, h100.hbm_bytes_per_s) == ("H100-SXM", 989.5e12, 3350e9)
    assert lookup_gpu_perf("H100-80GB") == h100  # the old name of the SXM part
    assert lookup_gpu_perf("a100-80gb").fp8_flops is None
    with pytest.raises(KvplanError, match="no FLOP/s or bandwidth figures for A10G"):
        lookup_gpu_perf("A10G")
    with pytest.raises(KvplanError, match="unknown GPU 'V100'"):
        lookup_gpu_perf("V100")
    fit = serving_fit()
    assert 0 < fit.compute_efficiency <= 1 and 0 < fit.memory_efficiency <= 1 and fit.step_overhead_s >= 0
