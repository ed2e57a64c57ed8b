"""Linear layers in fp32 on a CPU without bf16 GEMM instructions (engine/models/cpu_linear.py)."""

import pytest
import torch
from torch import nn

from engine.models import cpu_linear
from engine.models.cpu_linear import Fp32Linear, compute_linear_in_fp32_where_emulated
from engine.request import SamplingParams
from tests.engine.tiny import tiny_engine


def test_fp32_linear_is_the_fp32_product_of_the_bf16_values_rounded_to_bf16():
    torch.manual_seed(0)
    linear = nn.Linear(24, 40, bias=True).to(torch.bfloat16)
    x = torch.randn(5, 24).to(torch.bfloat16)
    y = Fp32Linear(linear)(x)
    # reference: widen the bf16 numbers, multiply and add in float64, round once to bf16
    ref = (x.double() @ linear.weight.double().T + linear.bias.double()).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == (5, 40)
    # fp32 accumulation differs from float64 by far less than one bf16 step: at most one rounding apart
    assert ((y.float() - ref.float()).abs() <= 2 ** -7 * ref.float().abs()).all()
    # fewer than FP32_MIN_ROWS rows (a small decode batch) take the native bf16 GEMM, bit for bit
    small = x[: cpu_linear.FP32_MIN_ROWS - 1]
    assert torch.equal(Fp32Linear(linear)(small), torch.nn.functional.linear(small, linear.weight, linear.bias))


@pytest.mark.parametrize("native", [True, False])
def test_only_a_cpu_without_native_bf16_gemm_swaps_its_linear_layers(monkeypatch, native):
    monkeypatch.setattr(cpu_linear, "half_matmul_is_native", lambda dtype: native)
    engine = tiny_engine(dtype="bfloat16")
    # tiny Llama: 2 layers x (wqkv, wo, w13, w2) + the output layer; none when bf16 GEMMs are native
    swapped = sum(isinstance(m, Fp32Linear) for m in engine.model.modules())
    assert swapped == (0 if native else 2 * 4 + 1)
    assert engine.kv_cache.layers[0].k_cache.dtype == torch.bfloat16  # the KV cache keeps the model dtype
    assert compute_linear_in_fp32_where_emulated(nn.Linear(2, 2), torch.float32, torch.device("cpu")) == 0


def test_a_swapped_bf16_engine_generates_what_it_was_asked(monkeypatch):
    monkeypatch.setattr(cpu_linear, "half_matmul_is_native", lambda dtype: False)
    engine = tiny_engine(dtype="bfloat16")
    outputs = engine.generate([[5, 17, 301, 44], [9, 2, 77]], SamplingParams(max_tokens=6, ignore_eos=True))
    assert [len(o.output_token_ids) for o in outputs] == [6, 6]
    assert all(0 <= t < 512 for o in outputs for t in o.output_token_ids)  # tiny Llama's vocabulary
