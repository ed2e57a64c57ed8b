"""Linear layers of a bf16/fp16 model on a CPU whose matmul units have no bf16/fp16 instructions.

There (x86 CPUs with AVX2 but no AVX512 / AMX, as the project's CI machine), oneDNN emulates a bf16
GEMM at a cost that grows with every row, while an fp32 GEMM on the same numbers streams twice the
weight bytes and then computes fast. So each linear layer keeps its bf16 weight and an fp32 copy
(the same values, exactly widened) and computes a call of ``FP32_MIN_ROWS`` rows or more (prefill
chunks, decode batches of 10 or more) as ``x.float() @ W.T`` in fp32, rounding the output back to
the model dtype; fewer rows take the native GEMM. The crossover was measured in the engine itself
(SmolLM2-135M, bf16, 2 threads, median decode-only step of a `workloads/chat.yaml` run, 2026-11-30
on the project's 2-core AVX2 machine), native bf16 against fp32 at each decode batch size:
4 -> 112 / 169 ms, 8 -> 200 / 204 ms, 10 -> 245 / 234 ms, 12 -> 290 / 215 ms, 16 -> 384 / 241 ms;
at 32 streams the engine's output tok/s went from 27.1 to 59.2 (bench/serve_throughput.py).
Everything between the linear layers (activations, norms, attention, the KV cache) stays in the
model dtype, so the KV cache's bytes and every block count are those of the bf16 model. A bf16
GEMM also accumulates in fp32; the two differ in summation order, so greedy outputs can part where
two logits nearly tie (as they can between any two GEMM libraries). CPUs with bf16/fp16 matmul
instructions, and CUDA, keep the native half-precision GEMM throughout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def half_matmul_is_native(dtype: torch.dtype) -> bool:
    """Whether this CPU runs ``dtype`` GEMMs natively (oneDNN's own check); True for fp32."""
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return True


FP32_MIN_ROWS = 10  # the measured crossover above


class Fp32Linear(nn.Module):
    """``y = x @ W.T + b``: in fp32 for ``FP32_MIN_ROWS`` rows or more, else natively in the
    weight's dtype; returned in ``x``'s dtype.

    x: [rows, in_features] (bf16/fp16) -> y: [rows, out_features] (same dtype as x).
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.half_weight, self.half_bias = linear.weight, linear.bias
        self.weight = nn.Parameter(linear.weight.detach().float(), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < FP32_MIN_ROWS * x.shape[-1]:
            return F.linear(x, self.half_weight, self.half_bias)
        return F.linear(x.float(), self.weight, self.bias).to(x.dtype)


def compute_linear_in_fp32_where_emulated(model: nn.Module, dtype: torch.dtype, device: torch.device) -> int:
    """Replace every ``nn.Linear`` of ``model`` by an ``Fp32Linear`` when ``device`` is a CPU
    without native ``dtype`` GEMMs (see the module docstring); returns how many were replaced
    (0 elsewhere). Weights tied to another module (the embedding) keep their own tensor there."""
    if device.type != "cpu" or half_matmul_is_native(dtype):
        return 0
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Fp32Linear(child))
                replaced += 1
    return replaced
