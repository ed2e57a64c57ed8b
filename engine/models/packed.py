"""bf16 linear layers on CPU with their weights reordered once for oneDNN.

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
    """Replace every bf16 CPU ``nn.Linear`` inside ``model`` by its PackedLinear (``pack``), in
    place; returns how many were packed. A weight tied to another module (the lm_head and the
    embedding) keeps its tensor there; the packed copy is the linear's own."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and (packed := pack(child)) is not None:
                setattr(parent, name, packed)
                count += 1
    return count
