"""Weight memory counted from a model's config: parameters x bytes per weight.

Used for the KV budget (GPU memory minus weights minus overhead) when no ``weights_gib`` is given.
"""

from __future__ import annotations

from kvplan.errors import KvplanError
from kvplan.sizing import dtypes
from kvplan.sizing.models.layer_spec import LayerSpec
from kvplan.sizing.models.model_spec import ModelSpec
from kvplan.sizing.models.state_shapes import GatedDeltaNetState, Mamba1State, Mamba2State


def count_parameters(spec: ModelSpec) -> tuple[int, int]:
    """(embedding + LM head parameters, all other parameters), counted from the config, layer by
    layer (:attr:`ModelSpec.layers`).

    Attention layer: q, k, v, o (``hidden x heads x k_head_dim`` for q, ``hidden x kv_heads x
    k_head_dim`` and ``... x v_head_dim`` for k and v, ``heads x v_head_dim x hidden`` for o;
    biases where the config sets them; q doubled where an output gate shares q_proj, as in
    Qwen3-Next and Qwen3.5). MLA layer (DeepSeek): q (through ``q_lora_rank`` when set), the
    ``hidden x (kv_lora_rank + qk_rope_head_dim)`` KV down-projection, its up-projection
    ``kv_lora_rank x heads x (qk_nope_head_dim + v_head_dim)`` and o. Recurrent layers: their
    mixer's projections, conv weights and per-head vectors (:func:`_state_mixer`). Every layer:
    an MLP (3 matrices ``hidden x intermediate`` when gated, else 2; MoE layers every expert's
    MLP + router + shared experts) and 2 norms. Small extras (q/k norms, attention sinks,
    Gemma 3n's per-layer embeddings) are left out: under 0.1 % of most catalog models.

    Raises:
        KvplanError: the config lacks hidden_size, vocab_size or intermediate_size.
    """
    h = _required(spec, "hidden_size", spec.hidden_size)
    vocab_size = _required(spec, "vocab_size", spec.vocab_size)
    intermediate_size = _required(spec, "intermediate_size", spec.intermediate_size)
    if spec.moe is not None and not spec.moe.expert_intermediate_size:
        raise KvplanError(
            "", "missing field moe_intermediate_size", "give `weights_gib` or `kv_memory_gib`", source=spec.name
        )
    embedding = vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    mats = 3 if spec.gated_mlp else 2
    dense_mlp = mats * h * intermediate_size
    moe_mlp = 0
    moe_layers: tuple[int, ...] = ()
    if spec.moe is not None:
        e = spec.moe
        moe_layers = e.moe_layers
        moe_mlp = e.num_experts * 3 * h * e.expert_intermediate_size + h * e.num_experts
        moe_mlp += e.num_experts * (2 * e.expert_intermediate_size + h + 1) if e.expert_bias else 0
        moe_mlp += e.num_shared_experts * 3 * h * e.expert_intermediate_size
        moe_mlp += (3 * h * e.shared_expert_intermediate_size + h) if e.shared_expert_intermediate_size else 0
    layers = h + sum(_mixer(spec, layer, h) + 2 * h for layer in spec.layers)
    layers += len(moe_layers) * moe_mlp + (spec.num_layers - len(moe_layers)) * dense_mlp
    return embedding, layers


def _required(spec: ModelSpec, field: str, value: int | None) -> int:
    """``value``, a size that counting the weights needs.

    Raises:
        KvplanError: the config lacks it (``value`` is None).
    """
    if value is None:
        raise KvplanError(
            "",
            f"missing field {field}",
            "it sizes the weights; give `weights_gib` or `kv_memory_gib`",
            source=spec.name,
        )
    return value


def _mixer(spec: ModelSpec, layer: LayerSpec, h: int) -> int:
    """Parameters of one layer's token mixer (attention and/or recurrent state); ``h``: the hidden size."""
    heads = spec.num_attention_heads
    total = _state_mixer(layer.state, h) if layer.state is not None else 0
    if layer.kind == "mla":
        m = spec.mla
        assert m is not None  # MLA layers are built only from a config with MLA dims (ModelSpec.mla)
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk if m.q_lora_rank else h * heads * qk
        kv = (
            h * (m.kv_lora_rank + m.qk_rope_head_dim)
            + m.kv_lora_rank
            + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        )
        total += q + kv + heads * m.v_head_dim * h
    elif layer.kind in ("full", "sliding"):
        q_width, v_width = heads * layer.k_head_dim, heads * layer.v_head_dim
        kv_width = layer.num_kv_heads * (layer.k_head_dim + layer.v_head_dim)
        total += h * q_width * (2 if spec.attn_output_gate else 1) + h * kv_width + v_width * h
        total += (q_width + kv_width) * spec.qkv_bias + h * spec.o_bias
    return total


def _state_mixer(state, h: int) -> int:
    """Parameters of a recurrent mixer, from its module definitions: Gated DeltaNet (transformers'
    Qwen3NextGatedDeltaNet: in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj),
    Mamba-2 (in_proj to x, z, B, C and dt; conv1d with bias; dt_bias, A_log, D; norm; out_proj),
    Mamba-1 (in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj; dt_rank = ceil(hidden / 16)),
    LFM2 short conv (in_proj to B, C, x; conv; out_proj)."""
    if isinstance(state, GatedDeltaNetState):
        key, value = state.num_k_heads * state.head_k_dim, state.num_v_heads * state.head_v_dim
        conv_dim = 2 * key + value
        return (
            h * (2 * key + 2 * value)
            + h * 2 * state.num_v_heads
            + conv_dim * state.conv_kernel
            + 2 * state.num_v_heads
            + state.head_v_dim
            + value * h
        )
    if isinstance(state, Mamba2State):
        inner, groups_state = state.intermediate_size, 2 * state.n_groups * state.state_size
        conv_dim = inner + groups_state
        return (
            h * (2 * inner + groups_state + state.num_heads)
            + conv_dim * (state.conv_kernel + 1)
            + 3 * state.num_heads
            + inner
            + inner * h
        )
    if isinstance(state, Mamba1State):
        inner, dt_rank = state.intermediate_size, -(-h // 16)
        return (
            h * 2 * inner
            + inner * (state.conv_kernel + 1)
            + inner * (dt_rank + 2 * state.state_size)
            + dt_rank * inner
            + inner
            + inner * state.state_size
            + inner
            + inner * h
        )
    return h * 3 * state.conv_dim + state.conv_dim * state.conv_kernel + state.conv_dim * h  # ShortConvState


def routed_expert_parameters(spec: ModelSpec) -> int:
    """Parameters of one routed expert of one MoE layer (0 for a dense model): its gated MLP,
    ``3 x hidden x moe_intermediate_size``, plus its biases where the experts carry them (gpt-oss:
    ``2 x moe_intermediate_size + hidden``). The router and shared experts are not routed: every
    token runs them. :func:`count_parameters` counts ``num_experts`` of these per MoE layer.

    Raises:
        KvplanError: an MoE config without hidden_size or moe_intermediate_size.
    """
    if spec.moe is None:
        return 0
    h = _required(spec, "hidden_size", spec.hidden_size)
    size = spec.moe.expert_intermediate_size
    if not size:
        raise KvplanError(
            "", "missing field moe_intermediate_size", "give `weights_gib` or `kv_memory_gib`", source=spec.name
        )
    return 3 * h * size + ((2 * size + h) if spec.moe.expert_bias else 0)


def weight_bytes_per_parameter(spec: ModelSpec, weight_dtype: str = "auto") -> tuple[float, float]:
    """(bytes per embedding / LM head parameter, bytes per other parameter) as
    :func:`weights_bytes` counts them.

    Raises:
        KvplanError: unknown weight dtype.
    """
    name = dtypes.canonical_weight(weight_dtype)
    if name == "auto":
        base = dtypes.DTYPES[dtypes.serving_dtype(spec.dtype)].bytes_per_element
        return base, spec.weight_bits / 8 if spec.weight_bits else base
    per = dtypes.weight_bytes_per_element(name)
    return per, per


def weights_bytes(spec: ModelSpec, weight_dtype: str = "auto") -> int:
    """Bytes of all weights: parameters x bytes per weight.

    ``auto``: a quantized checkpoint's bits (fp8, AWQ/GPTQ bits, mxfp4, nvfp4) for everything but
    the embeddings and LM head, which stay in the model dtype; otherwise the model dtype (float32
    checkpoints are served in fp16, as vLLM's ``--dtype auto`` does). A named dtype stores every
    weight in it; the FP4 formats (``nvfp4`` 4.5 bits, ``mxfp4`` 4.25 bits) count their block
    scales (:data:`kvplan.sizing.dtypes.FP4_WEIGHT_DTYPES`), int8 and int4 count bits / 8.

    Raises:
        KvplanError: unknown weight dtype.
    """
    embedding, other = count_parameters(spec)
    embedding_bytes, other_bytes = weight_bytes_per_parameter(spec, weight_dtype)
    if dtypes.canonical_weight(weight_dtype) == "auto":
        return int(embedding * embedding_bytes + other * other_bytes)
    return int((embedding + other) * other_bytes)
