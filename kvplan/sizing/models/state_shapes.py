"""Fixed per-request state of recurrent layers: linear attention (Gated DeltaNet), Mamba and short
convolutions.

Such a layer keeps no K/V per token; each request holds one conv state (the last ``kernel - 1``
inputs of its causal convolution) and, except short convs, one recurrent state, whatever its
length. The shapes are vLLM's ``MambaStateShapeCalculator`` formulas
(vllm/model_executor/layers/mamba/mamba_utils.py), per tensor-parallel rank, written out here;
``divide`` there asserts that tp divides what it splits, which :func:`_split` turns into a
one-line error. The element counts do not depend on the layout vLLM picks for the conv state.

State dtypes follow vLLM's ``MambaStateDtypeCalculator`` at its defaults (``mamba_cache_dtype``
and ``mamba_ssm_cache_dtype`` ``auto``): both states in the dtype the model runs in, except that a
config naming ``mamba_ssm_dtype`` (Qwen3.5) or ``mamba_ssm_cache_dtype`` keeps the recurrent
state in that dtype, as the model's vLLM config hook sets it, and Nemotron-H's recurrent state is
float32 unless its config says otherwise (vLLM's NemotronHForCausalLMConfig default). The KV cache dtype
(``kv_cache_dtype``, fp8 ...) does not apply to them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.errors import KvplanError

Shape = tuple[int, ...]


def _split(size: int, tp: int, what: str) -> int:
    if size % tp:
        raise KvplanError(
            "tp", f"{tp} does not divide the {size} {what}", "pick a tp that divides it (vLLM asserts it)"
        )
    return size // tp


def num_elements(shape: Shape) -> int:
    return math.prod(shape)


@dataclass(frozen=True)
class GatedDeltaNetState:
    """Qwen3-Next / Qwen3.5 ``linear_attention`` layers (config keys ``linear_num_key_heads``,
    ``linear_num_value_heads``, ``linear_key_head_dim``, ``linear_value_head_dim``,
    ``linear_conv_kernel_dim``).

    vLLM's ``gated_delta_net_state_shape``: conv state over the q, k and v channels
    ``(kernel - 1, (2 x k_heads x k_dim + v_heads x v_dim) / tp)``; recurrent state one
    ``k_dim x v_dim`` matrix per value head, ``(v_heads / tp, v_dim, k_dim)``.
    """

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    ssm_dtype: str | None = None
    kind = "linear"

    def shapes(self, tp: int) -> tuple[Shape, Shape]:
        conv_dim = 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim
        conv = (self.conv_kernel - 1, _split(conv_dim, tp, "linear-attention conv channels"))
        recurrent = (_split(self.num_v_heads, tp, "linear-attention value heads"), self.head_v_dim, self.head_k_dim)
        return conv, recurrent


@dataclass(frozen=True)
class Mamba2State:
    """Mamba-2 mixers (Granite-4.0-H, Falcon-H1, Nemotron-H, Mamba-2).

    vLLM's ``mamba2_state_shape``: groups are padded so that every rank holds the groups its
    heads need (``n_groups`` becomes ``tp`` when tp does not divide it); conv state over x, B
    and C ``(kernel - 1, (intermediate + 2 x n_groups x state_size) / tp)``; recurrent (SSM)
    state ``(heads / tp, head_dim, state_size)``.
    """

    intermediate_size: int
    n_groups: int
    num_heads: int
    head_dim: int
    state_size: int
    conv_kernel: int
    ssm_dtype: str | None = None
    kind = "mamba"

    def shapes(self, tp: int) -> tuple[Shape, Shape]:
        groups = self.n_groups if self.n_groups % tp == 0 else self.n_groups + tp - self.n_groups
        conv_dim = self.intermediate_size + 2 * groups * self.state_size
        conv = (self.conv_kernel - 1, _split(conv_dim, tp, "Mamba conv channels"))
        recurrent = (_split(self.num_heads, tp, "Mamba heads"), self.head_dim, self.state_size)
        return conv, recurrent


@dataclass(frozen=True)
class Mamba1State:
    """Mamba-1 mixers (Mamba, Falcon-Mamba, Jamba).

    vLLM's ``mamba1_state_shape``: conv state ``(kernel - 1, intermediate / tp)``; recurrent
    state ``(intermediate / tp, state_size)``.
    """

    intermediate_size: int
    state_size: int
    conv_kernel: int
    ssm_dtype: str | None = None
    kind = "mamba"

    def shapes(self, tp: int) -> tuple[Shape, Shape]:
        channels = _split(self.intermediate_size, tp, "Mamba channels")
        return (self.conv_kernel - 1, channels), (channels, self.state_size)


@dataclass(frozen=True)
class ShortConvState:
    """LFM2 ``conv`` layers: a gated short convolution with no recurrent state.

    vLLM's ``short_conv_state_shape`` with LFM2's arguments (``intermediate_size = hidden_size``,
    ``conv_kernel = conv_L_cache``): ``(conv_L_cache - 1, hidden / tp)``.
    """

    conv_dim: int
    conv_kernel: int
    kind = "conv"
    ssm_dtype = None

    def shapes(self, tp: int) -> tuple[Shape]:
        return ((self.conv_kernel - 1, _split(self.conv_dim, tp, "conv channels")),)


StateDims = GatedDeltaNetState | Mamba2State | Mamba1State | ShortConvState
