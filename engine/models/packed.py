"""bf16 linear layers on CPU: weights reordered once for oneDNN, or upcast once to fp32 where bf16 is emulated.

``F.linear`` on a bf16 CPU tensor reorders the weight into oneDNN's blocked layout on every call;
``torch.ops.mkldnn._reorder_linear_weight`` does it once at load and
``torch.ops.mkldnn._linear_pointwise`` multiplies with the reordered weight (the ops torch's
inductor emits for a frozen bf16 linear: ``torch/_inductor/fx_passes/mkldnn_fusion.py``)::

    nn.Linear(w [out, in], b)  --pack_linears-->  PackedLinear(packed = reorder(w), b)
    y = x @ w.T + b            ==                  _linear_pointwise(x, packed, b, "none", [], "")

Measured on Xeon-AMX (docs/benchmarks.md#engine-serve): a 32-decode step of SmolLM2-135M ~10 %
faster. The result is bit-identical to ``F.linear`` on SmolLM2's shapes for every row count on one
thread, and up to 256 rows on two (the decode steps); at 300+ rows on two threads both ops split a
layer's reduction over the threads, each its own way (``F.linear`` itself then differs from its
one-thread result), so a long prefill's hidden states differ by a bf16 rounding step
(tests/engine/test_packed_linear.py). Only bf16 weights on CPU are packed; fp32 (the engine's
exactness tests against transformers) and other devices stay ``nn.Linear``. A weight the op cannot
take (no oneDNN, a CPU without bf16 support) or whose packed product differs from ``F.linear`` on
``CHECK_ROWS`` stays ``nn.Linear`` too.

Where oneDNN has no bf16 kernels at all (a CPU without AVX-512 or AVX-NE-CONVERT, e.g. AVX2
only: ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` is False), torch multiplies bf16 matrices
in an emulated loop, about 4-10x slower than fp32 GEMM of the same shape at every row count
(docs/benchmarks.md#engine-serve). There each bf16 linear becomes an ``UpcastLinear``: the weight
upcast to fp32 once at load (exact), the input upcast per call (exact), one fp32 GEMM, the result
rounded to bf16::

    nn.Linear(w, b)  --pack_linears-->  UpcastLinear(w32 = fp32(w), b32)
    y = x @ w.T + b  ~=                 bf16((w32 @ fp32(x).T).T + b32)

The GEMM is asked as ``w32 @ x.T``: on the 2-CPU EPYC (AVX2) ``F.linear(x, w32)`` at 2 to 4 rows
cost about one single-row product per row (SmolLM2's 30 layers 15.5 / 40.0 / 54.9 / 47.7 ms at 1 /
2 / 3 / 4 rows, its 49,152 x 576 lm_head 8.9 / 20.9 / 31.0 / 21.6 ms), the transposed product
7.7-11.1 ms for that lm_head at 2 to 4 rows and 27.9 / 42.3 / 36.2 ms for the layers at 2 / 3 / 4
(docs/benchmarks.md#engine-serve).

Both products accumulate in fp32 and round once to bf16, so they differ only where the two
summation orders round to neighbouring bf16 values (~1e-4 of the elements, one bf16 step). It
doubles the linears' weight memory (fp32 copies; the tied lm_head gets its own).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CHECK_ROWS = (1, 7, 32)  # rows each packed weight is checked on against F.linear at load


def packing_available() -> bool:
    """Whether this torch build has the two oneDNN ops (CPU builds with mkldnn do)."""
    try:
        return torch.backends.mkldnn.is_available() and all(
            hasattr(torch.ops.mkldnn, op) for op in ("_reorder_linear_weight", "_linear_pointwise")
        )
    except (AttributeError, RuntimeError):
        return False


class PackedLinear(nn.Module):
    """``nn.Linear``'s forward over a weight reordered for oneDNN. x: [..., in_features] bf16 ->
    [..., out_features] bf16. ``packed`` is opaque (oneDNN's layout): only this op reads it."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def bf16_matmul_emulated() -> bool:
    """Whether a bf16 matrix multiply on this CPU runs emulated (oneDNN has no bf16 kernels here)."""
    try:
        return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):  # a torch build without oneDNN: its own loops, also emulated
        return True


class UpcastLinear(nn.Module):
    """``nn.Linear``'s forward computed in fp32 on a bf16 layer: x [..., in_features] (bf16) ->
    [..., out_features] in x's dtype. ``weight`` [out, in] and ``bias`` [out] are fp32 copies."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        # w32 @ rows.T, not F.linear(rows, w32): the same fp32 product, 1.3-3x faster at 2 to 32
        # rows on an AVX2 CPU (F.linear's small-row GEMM there costs per row; module docstring)
        y = torch.mm(self.weight, rows.t()).t()
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype, memory_format=torch.contiguous_format).reshape(*x.shape[:-1], self.out_features)


def upcast(linear: nn.Linear) -> UpcastLinear | None:
    """``linear`` as an UpcastLinear, or None: not bf16 on CPU, or this CPU multiplies bf16 natively."""
    weight = linear.weight
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or not bf16_matmul_emulated():
        return None
    bias = linear.bias.detach().float() if linear.bias is not None else None
    return UpcastLinear(weight.detach().float(), bias)


def pack(linear: nn.Linear) -> PackedLinear | None:
    """``linear`` as a PackedLinear, or None: not bf16 on CPU, the op refuses it, or its product
    differs from ``F.linear`` on ``CHECK_ROWS`` rows."""
    weight = linear.weight
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or not packing_available():
        return None
    bias = linear.bias.detach() if linear.bias is not None else None
    with torch.inference_mode():
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        except RuntimeError:  # e.g. a CPU without the bf16 instructions oneDNN needs here
            return None
        out = PackedLinear(packed, bias, linear.in_features, linear.out_features)
        generator = torch.Generator().manual_seed(0)
        for rows in CHECK_ROWS:
            x = torch.randn(rows, linear.in_features, generator=generator).to(torch.bfloat16)
            if not torch.equal(out(x), F.linear(x, weight, linear.bias)):
                return None
    return out


def pack_linears(model: nn.Module) -> int:
    """Replace every bf16 CPU ``nn.Linear`` inside ``model`` by its PackedLinear (``pack``), or,
    where bf16 matrix multiplies are emulated, by its UpcastLinear (``upcast``), in place; returns
    how many were replaced. A weight tied to another module (the lm_head and the embedding) keeps
    its tensor there; the packed or fp32 copy is the linear's own."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and (fast := pack(child) or upcast(child)) is not None:
                setattr(parent, name, fast)
                count += 1
    return count
