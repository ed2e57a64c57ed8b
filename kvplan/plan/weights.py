"""Weight memory counted from a model's config: parameters x bytes per weight.

Used for the KV budget (GPU memory minus weights minus overhead) when no ``weights_gib`` is given.
"""

from __future__ import annotations

from kvplan.errors import KvplanError
from kvplan.plan import dtypes
from kvplan.plan.model_spec import ModelSpec


def count_parameters(spec: ModelSpec) -> tuple[int, int]:
    """(embedding + LM head parameters, all other parameters), counted from the config.

    Dense layer: attention q, k, v, o (``hidden x heads x head_dim`` and ``hidden x kv_heads x
    head_dim`` each for k and v, biases where the config sets them) + MLP (3 matrices
    ``hidden x intermediate`` when gated, else 2) + 2 norms. MoE layer: every expert's MLP +
    router + shared experts. MLA layer (DeepSeek): q (through ``q_lora_rank`` when set), the
    ``hidden x (kv_lora_rank + qk_rope_head_dim)`` KV down-projection, its up-projection
    ``kv_lora_rank x heads x (qk_nope_head_dim + v_head_dim)`` and o. Small extras (q/k norms,
    attention sinks) are left out: under 0.1 % of any catalog model.

    Raises:
        KvplanError: the config lacks hidden_size, vocab_size or intermediate_size.
    """
    for field, value in (("hidden_size", spec.hidden_size), ("vocab_size", spec.vocab_size),
                         ("intermediate_size", spec.intermediate_size)):
        if value is None:
            raise KvplanError("", f"missing field {field}", "it sizes the weights; give `weights_gib` or `kv_memory_gib`", source=spec.name)
    if spec.moe is not None and not spec.moe.expert_intermediate_size:
        raise KvplanError("", "missing field moe_intermediate_size", "give `weights_gib` or `kv_memory_gib`", source=spec.name)
    h, hd = spec.hidden_size, spec.head_dim
    embedding = spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    if spec.mla is not None:
        m = spec.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        heads = spec.num_attention_heads
        q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk if m.q_lora_rank else h * heads * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        attention = q + kv + heads * m.v_head_dim * h
    else:
        q_width, kv_width = spec.num_attention_heads * hd, spec.num_kv_heads * hd
        attention = 2 * h * q_width + 2 * h * kv_width
        attention += (q_width + 2 * kv_width) * spec.qkv_bias + h * spec.o_bias
    mats = 3 if spec.gated_mlp else 2
    dense_mlp = mats * h * spec.intermediate_size
    moe_mlp, moe_layers = 0, ()
    if spec.moe is not None:
        e = spec.moe
        moe_layers = e.moe_layers
        moe_mlp = e.num_experts * 3 * h * e.expert_intermediate_size + h * e.num_experts
        moe_mlp += e.num_experts * (2 * e.expert_intermediate_size + h + 1) if e.expert_bias else 0
        moe_mlp += e.num_shared_experts * 3 * h * e.expert_intermediate_size
        moe_mlp += (3 * h * e.shared_expert_intermediate_size + h) if e.shared_expert_intermediate_size else 0
    layers = spec.num_layers * (attention + 2 * h) + h
    layers += len(moe_layers) * moe_mlp + (spec.num_layers - len(moe_layers)) * dense_mlp
    return embedding, layers


def weights_bytes(spec: ModelSpec, weight_dtype: str = "auto") -> int:
    """Bytes of all weights: parameters x bytes per weight.

    ``auto``: a quantized checkpoint's bits (fp8, AWQ/GPTQ bits, mxfp4) for everything but the
    embeddings and LM head, which stay in the model dtype; otherwise the model dtype (float32
    checkpoints are served in fp16, as vLLM's ``--dtype auto`` does).

    Raises:
        KvplanError: unknown weight dtype.
    """
    embedding, other = count_parameters(spec)
    base = dtypes.DTYPES[dtypes.serving_dtype(spec.dtype)].bytes_per_element
    name = dtypes.canonical(weight_dtype, "weight_dtype")
    if name == "auto":
        other_bytes = spec.weight_bits / 8 if spec.weight_bits else base
        return int(embedding * base + other * other_bytes)
    return int((embedding + other) * dtypes.DTYPES[name].bytes_per_element)
