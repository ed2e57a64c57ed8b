"""ModelSpec: the architecture numbers a KV estimate needs, and the only reader of Hugging Face keys.

Where a spec's config comes from (a bundled preset, a user's config.json or folder, a GGUF file) is
:mod:`kvplan.plan.model_source`; every source goes through the same reader,
:meth:`ModelSpec.from_hf_config` (GGUF metadata is first mapped onto those keys by
:mod:`kvplan.plan.gguf_spec`). Every number is checked here, at the edge: whole, finite, in range, and
consistent (KV heads dividing the attention heads, one layer type per layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

from kvplan.errors import KvplanError
from kvplan.plan.dtypes import CHECKPOINT_DTYPES

# Model types whose config class defaults tie_word_embeddings to False when the key is absent
# (transformers' LlamaConfig, MistralConfig, Qwen2Config, ...); the base class defaults to True.
_UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3"}
# Architectures with a two-matrix MLP (up, down) instead of a gated three-matrix one.
_PLAIN_MLP = {"falcon", "gpt_bigcode", "gpt2", "gpt_neox", "opt", "phi"}
# vLLM falls back to 2048 tokens when a config names no maximum length.
_DEFAULT_MAX_LEN = 2048
# Upper bounds on config integers. No published model comes near them; they keep byte counts
# within float range and the per-layer tuples small (the deepest decoders have a few hundred layers).
_MAX_SIZE = 2**31 - 1
_MAX_LAYERS = 10_000
# Model types whose attention is MLA (DeepSeek-V2/V3; deepseek2 is GGUF's architecture name).
_MLA_MODEL_TYPES = {"deepseek_v2", "deepseek_v3", "deepseek2"}
# Keys that published configs omit and that transformers 5 fills from the config class defaults
# (Gemma3TextConfig, FalconConfig); the class applies them when it loads such a config.
_CLASS_DEFAULTS = {
    "gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072, "sliding_window": 4096},
    "falcon": {"vocab_size": 65_024, "max_position_embeddings": 2048},
}


@dataclass(frozen=True)
class MLADims:
    """Multi-head latent attention sizes (DeepSeek-V2/V3 config keys of the same names)."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


@dataclass(frozen=True)
class MoEDims:
    """Mixture-of-experts sizes. ``moe_layers``: indices of layers whose MLP is the expert block."""

    num_experts: int
    expert_intermediate_size: int  # 0 when the config omits it
    num_shared_experts: int  # DeepSeek: shared experts of the expert size
    shared_expert_intermediate_size: int  # Qwen2-MoE style: one shared MLP of this size (0: none)
    moe_layers: tuple[int, ...]
    expert_bias: bool  # gpt-oss experts and router carry biases


@dataclass(frozen=True)
class ModelSpec:
    """One model's architecture, in the units a KV estimate needs.

    ``layer_kinds[i]`` is ``"full"`` or ``"sliding"`` (attention of layer ``i``); ``dtype`` is the
    checkpoint's torch dtype name (float32, float16 or bfloat16); ``weight_bits`` is set for
    quantized checkpoints (fp8, AWQ, ...). ``derived_max_model_len`` is the longest request vLLM
    accepts for the model (tokens; see :func:`_derived_max_model_len`), None when the config names
    no length. The KV numbers are required; hidden, vocabulary and MLP sizes only when weights
    are counted.
    """

    name: str
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    layer_kinds: tuple[str, ...]
    sliding_window: int | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    gated_mlp: bool
    qkv_bias: bool
    o_bias: bool
    # Needed only to count parameters (weights); None when the config omits them.
    hidden_size: int | None = None
    vocab_size: int | None = None
    intermediate_size: int | None = None
    mla: MLADims | None = None
    moe: MoEDims | None = None
    weight_bits: float | None = None
    derived_max_model_len: int | None = None

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str) -> ModelSpec:
        """Read a Hugging Face config dict (config.json, or transformers 5's ``config.to_dict()``).

        Multimodal configs are read from their ``text_config``. The dtype key may be ``dtype`` or
        ``torch_dtype``.

        Raises:
            KvplanError: ``<name>: missing field <key>`` when a needed number is absent;
                ``<name>: field <key> must ...`` when a value is not a whole number in range (NaN,
                1e308, 8.5), a mapping is not one, layer_types does not list every layer, the KV
                heads do not divide the attention heads, or the dtype is unknown.
        """
        text = dict(_mapping(config, name, "text_config") or config)
        for key in ("torch_dtype", "dtype", "quantization_config"):
            if text.get(key) is None and config.get(key) is not None:
                text[key] = config[key]
        return _read(text, name)


def _present(cfg: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    """The first of ``keys`` that ``cfg`` sets (not null)."""
    return next((key for key in keys if cfg.get(key) is not None), None)


def _count(cfg: dict[str, Any], name: str, *keys: str, default: Any = None, required: bool = False,
           minimum: int = 1, maximum: int = _MAX_SIZE) -> Any:
    """The first of ``keys`` set in ``cfg`` as a whole number in [minimum, maximum] (JSON may write
    it as 32.0), else ``default``."""
    key = _present(cfg, keys)
    if key is None:
        if required:
            raise KvplanError("", f"missing field {keys[0]}", "the config must set it", source=name)
        return default
    value = cfg[key]
    whole = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if isinstance(value, bool) or not whole or value < minimum:
        raise KvplanError("", f"field {key} must be a whole number >= {minimum} (got {value!r})", source=name)
    if value > maximum:
        raise KvplanError("", f"field {key} must be at most {maximum:,} (got {value!r})", "no published model comes near it", source=name)
    return int(value)


def _mapping(cfg: dict[str, Any], name: str, key: str) -> dict[str, Any] | None:
    value = cfg.get(key)
    if value is not None and not isinstance(value, dict):
        raise KvplanError("", f"field {key} must be a mapping of keys to values (got {str(value)[:40]!r})", source=name)
    return value


def _read(cfg: dict[str, Any], name: str) -> ModelSpec:
    cfg = {**_CLASS_DEFAULTS.get(str(cfg.get("model_type", "")).lower(), {}), **cfg}
    count = partial(_count, cfg, name)

    model_type = str(cfg.get("model_type") or "").lower()
    num_layers = count("num_hidden_layers", "n_layer", "num_layers", "n_layers", required=True, maximum=_MAX_LAYERS)
    hidden = count("hidden_size", "n_embd", "d_model", "dim")
    heads_keys = ("num_attention_heads", "n_head", "num_heads", "n_heads")
    heads = count(*heads_keys, required=True)
    if cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
        kv_heads = 1  # multi-query attention (Falcon-7B, StarCoder); Falcon's own num_kv_heads is ignored then
    else:
        kv_keys = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
        kv_heads = count(*kv_keys, default=heads)
        if heads % kv_heads:
            raise KvplanError("", f"field {_present(cfg, kv_keys)} ({kv_heads}) must divide {_present(cfg, heads_keys)} "
                              f"({heads})", "grouped-query attention gives each KV head a whole group of query heads", source=name)
    head_dim = count("head_dim", "kv_channels")
    if cfg.get("kv_lora_rank") is None and model_type in _MLA_MODEL_TYPES:
        raise KvplanError("", "missing field kv_lora_rank", f"{model_type} attention (MLA) caches a latent of that size", source=name)
    if head_dim is None and cfg.get("kv_lora_rank") is None:
        if hidden is None or hidden % heads:
            raise KvplanError("", "missing field head_dim", "set head_dim, or a hidden_size that the heads divide", source=name)
        head_dim = hidden // heads
    mlp_default = 4 * hidden if hidden is not None and model_type in _PLAIN_MLP else None
    intermediate = count("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim", default=mlp_default)
    dtype_key = _present(cfg, ("torch_dtype", "dtype"))
    dtype = str(cfg[dtype_key]).removeprefix("torch.") if dtype_key else "float32"
    if dtype not in CHECKPOINT_DTYPES:
        raise KvplanError("", f"field {dtype_key} must be one of {', '.join(CHECKPOINT_DTYPES)} "
                          f"(got {cfg[dtype_key]!r})", "set the checkpoint's dtype", source=name)
    window = count("sliding_window")
    # Qwen2/Qwen3 configs carry a sliding_window that applies only with use_sliding_window
    # (default False in their config classes).
    if cfg.get("use_sliding_window", not model_type.startswith("qwen")) is False:
        window = None
    mla = None
    if cfg.get("kv_lora_rank") is not None:
        mla = MLADims(
            kv_lora_rank=count("kv_lora_rank"),
            qk_rope_head_dim=count("qk_rope_head_dim", required=True),
            qk_nope_head_dim=count("qk_nope_head_dim", default=0, minimum=0),
            v_head_dim=count("v_head_dim", required=True),
            q_lora_rank=count("q_lora_rank"),
        )
    tied = cfg.get("tie_word_embeddings")
    max_len = count("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length")
    return ModelSpec(
        name=name,
        model_type=model_type,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim or 0,  # MLA layers use the latent sizes instead
        dtype=dtype,
        layer_kinds=_layer_kinds(cfg, name, model_type, num_layers, window),
        sliding_window=window,
        max_position_embeddings=max_len or _DEFAULT_MAX_LEN,
        tie_word_embeddings=bool(model_type not in _UNTIED_BY_DEFAULT if tied is None else tied),
        gated_mlp=model_type not in _PLAIN_MLP,
        qkv_bias=bool(cfg.get("attention_bias") or cfg.get("bias") or cfg.get("qkv_bias") or model_type == "qwen2"),
        o_bias=bool(cfg.get("attention_bias") or cfg.get("bias")),
        hidden_size=hidden,
        vocab_size=count("vocab_size", "padded_vocab_size"),
        intermediate_size=intermediate,
        mla=mla,
        moe=_moe(cfg, name, model_type, num_layers),
        weight_bits=_weight_bits(_mapping(cfg, name, "quantization_config"), name),
        derived_max_model_len=_derived_max_model_len(cfg, name, model_type, max_len),
    )


def _derived_max_model_len(cfg: dict[str, Any], name: str, model_type: str, max_len: int | None) -> int | None:
    """The longest request vLLM accepts (tokens), from its ``_get_and_verify_max_len``: the config's
    length, times ``rope_scaling.factor`` for rope types other than llama3, longrope and su, with
    yarn scaling ``original_max_position_embeddings`` instead; Gemma 3's length is already scaled.
    None when the config names no length (vLLM then assumes 2048)."""
    rope = _mapping(cfg, name, "rope_scaling") or _mapping(cfg, name, "rope_parameters")  # transformers 5's key
    if max_len is None or not rope or model_type.startswith("gemma3"):
        return max_len
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in ("default", "llama3", "longrope", "su"):
        return max_len
    factor = 1.0 if rope.get("factor") is None else rope["factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < _MAX_SIZE:
        raise KvplanError("", f"field rope_scaling.factor must be a number > 0 (got {factor!r})", source=name)
    if rope_type == "yarn":
        max_len = _count(rope, name, "original_max_position_embeddings", default=max_len)
    return min(int(max_len * factor), _MAX_SIZE)


def _layer_kinds(cfg: dict[str, Any], name: str, model_type: str, num_layers: int, window: Any) -> tuple[str, ...]:
    """Attention kind per layer: an explicit ``layer_types`` list, else the model family's pattern."""
    layer_types = cfg.get("layer_types")
    if layer_types is not None and not (
        isinstance(layer_types, list) and len(layer_types) == num_layers and all(isinstance(t, str) for t in layer_types)
    ):
        got = f"{len(layer_types)} entries" if isinstance(layer_types, list) else repr(layer_types)[:40]
        raise KvplanError("", f"field layer_types must list one type per layer, {num_layers} strings such as "
                          f"'full_attention' or 'sliding_attention' (got {got})", source=name)
    if window is None:
        return ("full",) * num_layers
    if layer_types:
        return tuple("sliding" if t.startswith("sliding") else "full" for t in layer_types)
    count = partial(_count, cfg, name)
    pattern = count("sliding_window_pattern", "_sliding_window_pattern")
    if pattern is None and model_type.startswith("gemma3"):
        pattern = 6  # Gemma 3: five local layers, then one global (Gemma 3 technical report)
    if pattern is None and model_type == "gemma2":
        pattern = 2  # Gemma 2 alternates local and global layers, local first
    if pattern:
        return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))
    first_window_layer = count("max_window_layers", minimum=0)
    if cfg.get("use_sliding_window") and first_window_layer is not None:
        # Qwen2/Qwen3: layers from max_window_layers on use the window (transformers' layer_types rule).
        return tuple("sliding" if i >= first_window_layer else "full" for i in range(num_layers))
    return ("sliding",) * num_layers


def _moe(cfg: dict[str, Any], name: str, model_type: str, num_layers: int) -> MoEDims | None:
    count = partial(_count, cfg, name, minimum=0)
    num_experts = count("n_routed_experts", "num_local_experts", "num_experts")
    if not num_experts:
        return None
    first_dense = count("first_k_dense_replace")
    if first_dense is not None:  # DeepSeek: dense MLP in the first k layers
        freq = count("moe_layer_freq") or 1
        moe_layers = tuple(i for i in range(num_layers) if i >= first_dense and i % freq == 0)
    else:  # Qwen-MoE: mlp_only_layers and decoder_sparse_step; Mixtral, gpt-oss: every layer
        dense = set(cfg.get("mlp_only_layers") or [])
        step = count("decoder_sparse_step") or 1
        moe_layers = tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
    return MoEDims(
        num_experts=num_experts,
        expert_intermediate_size=count("moe_intermediate_size", "intermediate_size", default=0),
        num_shared_experts=count("n_shared_experts", default=0),
        shared_expert_intermediate_size=count("shared_expert_intermediate_size", default=0),
        moe_layers=moe_layers,
        expert_bias=model_type == "gpt_oss",
    )


def _weight_bits(quant: dict[str, Any] | None, name: str) -> float | None:
    """Bits per weight of a quantized checkpoint, scales included where the format fixes them."""
    if not quant:
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return 8.0
    if method == "mxfp4":
        return 4.25  # 4-bit values + one 8-bit scale per 32 (OCP microscaling format)
    if quant.get("bits"):
        return float(_count(quant, name, "bits", maximum=32))
    if quant.get("load_in_4bit"):
        return 4.0
    if quant.get("load_in_8bit"):
        return 8.0
    return None
