"""Linear layers of a bf16/fp16 model on a CPU whose matmul units have no bf16/fp16 instructions.

There (x86 CPUs with AVX2 but no AVX512_BF16 / AMX, as the project's CI machine), oneDNN emulates a
bf16 GEMM and a decode-sized one runs about 4x slower than the same GEMM in fp32 (measured
2026-11-30 on the project's 2-core AVX2 machine: [32, 576] x [576, 1536] in 7.3 ms bf16 against
2.0 ms fp32, one thread). So each linear layer keeps its weight as fp32 (the bf16 values, exactly
widened) and computes ``x.float() @ W.T`` in fp32, rounding its output back to the model dtype.
Everything between the linear layers (activations, norms, attention, the KV cache) stays in the
model dtype, so the KV cache's bytes and every block count are those of the bf16 model. A bf16
GEMM also accumulates in fp32; the two differ only in summation order, so greedy outputs can part
where two logits nearly tie (as they can between any two GEMM libraries). CPUs with bf16/fp16
matmul instructions, and CUDA, keep the native half-precision GEMM.
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


class Fp32Linear(nn.Module):
    """``y = x @ W.T + b`` computed in fp32 and returned in ``x``'s dtype.

    x: [..., in_features] (bf16/fp16) -> y: [..., out_features] (same dtype as x).
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().float(), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
