"""ModelSpec: the architecture numbers a KV estimate needs, and the only reader of Hugging Face keys.

Where a spec's config comes from (a bundled preset, a user's config.json or folder, a GGUF file,
Meta's params.json) is :mod:`kvplan.sizing.models.model_source`; every source goes through the same
reader, :meth:`ModelSpec.from_hf_config` (GGUF metadata and params.json are first mapped onto
those keys, with ``key_names`` so that errors name the keys of the file being read). Every
number is checked here, at the edge: whole, finite, in range, and consistent (KV heads dividing
the attention heads, one layer type per layer). The per-layer cache spec is
:mod:`kvplan.sizing.models.layer_spec`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.sizing.dtypes import CHECKPOINT_DTYPES, FP4_WEIGHT_DTYPES
from kvplan.sizing.models.config_reader import MAX_LAYERS, MAX_SIZE, ConfigReader
from kvplan.sizing.models.kv_keys import KV_HEAD_KEYS, check_kv_keys
from kvplan.sizing.models.layer_spec import LayerSpec, layer_kinds, recurrent_state

# Model types whose config class defaults tie_word_embeddings to False when the key is absent
# (transformers' LlamaConfig, MistralConfig, Qwen2Config, ...); the base class defaults to True.
_UNTIED_BY_DEFAULT = {
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "qwen3_next",
}
# Architectures with a two-matrix MLP (up, down) instead of a gated three-matrix one.
_PLAIN_MLP = {"falcon", "gpt_bigcode", "gpt2", "gpt_neox", "opt", "phi"}
# vLLM falls back to 2048 tokens when a config names no maximum length.
_DEFAULT_MAX_LEN = 2048
# Model types whose attention is MLA (DeepSeek-V2/V3; deepseek2 is GGUF's architecture name).
_MLA_MODEL_TYPES = {"deepseek_v2", "deepseek_v3", "deepseek2"}
# Keys that published configs omit and that transformers 5 fills from the config class defaults
# (Gemma3TextConfig, FalconConfig); the class applies them when it loads such a config.
_CLASS_DEFAULTS = {
    "gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072, "sliding_window": 4096},
    "falcon": {"vocab_size": 65_024, "max_position_embeddings": 2048},
}
_HEADS_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "num_query_heads")
_KV_KEYS = KV_HEAD_KEYS


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
    """Mixture-of-experts sizes. ``moe_layers``: indices of layers whose MLP is the expert block;
    ``experts_per_token``: the routed experts each token runs per MoE layer (top-k:
    ``num_experts_per_tok``; 0 when the config omits it)."""

    num_experts: int
    expert_intermediate_size: int  # 0 when the config omits it
    num_shared_experts: int  # DeepSeek: shared experts of the expert size
    shared_expert_intermediate_size: int  # Qwen2-MoE style: one shared MLP of this size (0: none)
    moe_layers: tuple[int, ...]
    expert_bias: bool  # gpt-oss experts and router carry biases
    experts_per_token: int = 0


@dataclass(frozen=True)
class ModelSpec:
    """One model's architecture, in the units a KV estimate needs.

    ``layers[i]`` is layer ``i``'s cache spec (:class:`kvplan.sizing.models.layer_spec.LayerSpec`: kind,
    KV heads, K and V widths, window, fixed state); every KV number kvplan prints is a sum over
    it. ``num_kv_heads`` and ``head_dim`` are the config's own (the first attention layer's when
    layers differ); ``num_attention_heads`` is 0 for a model without attention. ``dtype`` is the
    checkpoint's torch dtype name (float32, float16 or bfloat16); ``weight_bits`` is set for
    quantized checkpoints (fp8, AWQ, ...). ``derived_max_model_len`` is the longest request vLLM
    accepts (tokens; see :func:`_derived_max_model_len`), None when the config names no length.
    Hidden, vocabulary and MLP sizes are needed only when weights are counted.
    """

    name: str
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    layers: tuple[LayerSpec, ...]
    sliding_window: int | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    gated_mlp: bool
    qkv_bias: bool
    o_bias: bool
    attn_output_gate: bool = False  # q_proj also yields an output gate (Qwen3-Next, Qwen3.5)
    # Needed only to count parameters (weights); None when the config omits them.
    hidden_size: int | None = None
    vocab_size: int | None = None
    intermediate_size: int | None = None
    mla: MLADims | None = None
    moe: MoEDims | None = None
    weight_bits: float | None = None
    derived_max_model_len: int | None = None

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """``layers[i].kind`` for every layer."""
        return tuple(layer.kind for layer in self.layers)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str, key_names: dict[str, str] | None = None) -> ModelSpec:
        """Read a Hugging Face config dict (config.json, or transformers 5's ``config.to_dict()``).

        Multimodal configs are read from their ``text_config``. The dtype key may be ``dtype`` or
        ``torch_dtype``. ``key_names`` spells keys in errors (Hugging Face key -> the key of the
        file read, e.g. GGUF's ``llama.attention.value_length``).

        Raises:
            KvplanError: ``<name>: missing field <key>`` when a needed number is absent; a key
                that speaks of KV heads and that kvplan does not read (:mod:`kvplan.sizing.models.kv_keys`);
                ``<name>: field <key> must ...`` when a value is not a whole number in range (NaN,
                1e308, 8.5), a mapping is not one, layer_types does not list every layer or names
                an unknown type, the KV heads do not divide the attention heads, or the dtype is
                unknown.
        """
        top = ConfigReader(config, name, key_names or {})
        check_kv_keys(config, name)
        text = dict(top.mapping("text_config") or config)
        for key in ("torch_dtype", "dtype", "quantization_config"):
            if text.get(key) is None and config.get(key) is not None:
                text[key] = config[key]
        model_type = str(text.get("model_type") or "").lower()
        text = {**_CLASS_DEFAULTS.get(model_type, {}), **text}
        return _read(ConfigReader(text, name, key_names or {}), model_type)


def _read(r: ConfigReader, model_type: str) -> ModelSpec:
    num_layers = r.count(
        "num_hidden_layers",
        "n_layer",
        "num_layers",
        "n_layers",
        "num_transformer_layers",
        required=True,
        maximum=MAX_LAYERS,
    )
    hidden = r.count("hidden_size", "n_embd", "d_model", "dim", "model_dim")
    if r.cfg.get("kv_lora_rank") is None and model_type in _MLA_MODEL_TYPES:
        raise r.error(
            f"missing field {r.key('kv_lora_rank')}", f"{model_type} attention (MLA) caches a latent of that size"
        )
    window = r.count("sliding_window")
    # Qwen2/Qwen3 configs carry a sliding_window that applies only with use_sliding_window
    # (default False in their config classes).
    if r.cfg.get("use_sliding_window", not model_type.startswith("qwen")) is False:
        window = None
    kinds = layer_kinds(r, model_type, num_layers, window)
    layers, heads, kv_heads, head_dim = _layers(r, model_type, kinds, hidden, window)
    mla = None
    if r.cfg.get("kv_lora_rank") is not None:
        mla = MLADims(
            kv_lora_rank=r.count("kv_lora_rank"),
            qk_rope_head_dim=r.count("qk_rope_head_dim", required=True),
            qk_nope_head_dim=r.count("qk_nope_head_dim", default=0, minimum=0),
            v_head_dim=r.count("v_head_dim", required=True),
            q_lora_rank=r.count("q_lora_rank"),
        )
        latent = mla.kv_lora_rank + mla.qk_rope_head_dim
        layers = [LayerSpec("mla", 1, latent, 0) if layer.has_attention else layer for layer in layers]
    mlp_default = 4 * hidden if hidden is not None and model_type in _PLAIN_MLP else None
    dtype_key = r.present("torch_dtype", "dtype")
    dtype = str(r.cfg[dtype_key]).removeprefix("torch.") if dtype_key else "float32"
    if dtype_key is not None and dtype not in CHECKPOINT_DTYPES:  # the default, float32, is one of them
        raise r.error(
            f"field {r.key(dtype_key)} must be one of {', '.join(CHECKPOINT_DTYPES)} (got {r.cfg[dtype_key]!r})",
            "set the checkpoint's dtype",
        )
    tied = r.cfg.get("tie_word_embeddings")
    max_len = r.count("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length")
    return ModelSpec(
        name=r.name,
        model_type=model_type,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        layers=tuple(layers),
        sliding_window=window,
        max_position_embeddings=max_len or _DEFAULT_MAX_LEN,
        tie_word_embeddings=bool(model_type not in _UNTIED_BY_DEFAULT if tied is None else tied),
        gated_mlp=model_type not in _PLAIN_MLP,
        qkv_bias=bool(
            r.cfg.get("attention_bias") or r.cfg.get("bias") or r.cfg.get("qkv_bias") or model_type == "qwen2"
        ),
        o_bias=bool(r.cfg.get("attention_bias") or r.cfg.get("bias")),
        attn_output_gate=bool(r.cfg.get("attn_output_gate", model_type.startswith("qwen3_next"))),
        hidden_size=hidden,
        vocab_size=r.count("vocab_size", "padded_vocab_size"),
        intermediate_size=_intermediate(r, mlp_default),
        mla=mla,
        moe=_moe(r, model_type, num_layers),
        weight_bits=_weight_bits(r, r.mapping("quantization_config")),
        derived_max_model_len=_derived_max_model_len(r, model_type, max_len),
    )


def _layers(
    r: ConfigReader, model_type: str, kinds: list[str], hidden: int | None, window: int | None
) -> tuple[list[LayerSpec], int, int, int]:
    """(layer specs, attention heads, KV heads, head_dim) from the kinds and the head counts.

    Per-layer head counts (a list per layer: GGUF arrays, OpenELM) are read layer by layer; a layer
    with 0 KV heads holds no KV. Gemma 4's full-attention layers use ``num_global_key_value_heads``
    and ``global_head_dim``; the last ``num_kv_shared_layers`` layers (Gemma 3n, Gemma 4) reuse an
    earlier layer's KV and hold none of their own.
    """
    n = len(kinds)
    attention = [i for i, kind in enumerate(kinds) if kind in ("full", "sliding", "chunked")]
    heads = r.per_layer(_HEADS_KEYS if model_type != "mamba2" else _HEADS_KEYS[:2], n, minimum=0)
    if attention and heads is None:
        raise r.missing("num_attention_heads")
    heads = heads or [0] * n
    if r.cfg.get("multi_query") and not r.cfg.get("new_decoder_architecture"):
        kv = [1] * n  # multi-query attention (Falcon-7B, StarCoder); Falcon's own num_kv_heads is ignored then
    else:
        kv = r.per_layer(_KV_KEYS, n, minimum=0) or list(heads)
    head_dim = r.count("head_dim", "kv_channels")
    if head_dim is None and attention and r.cfg.get("kv_lora_rank") is None:
        h = heads[attention[0]]
        if hidden is None or not h or hidden % h:
            raise r.error(f"missing field {r.key('head_dim')}", "set head_dim, or a hidden_size that the heads divide")
        head_dim = hidden // h
    head_dim = head_dim or 0
    v_dim = head_dim if r.cfg.get("kv_lora_rank") is not None else r.count("v_head_dim", default=head_dim)
    global_kv = r.count("num_global_key_value_heads")
    global_dim = r.count("global_head_dim")
    chunk = r.count("attention_chunk_size")
    shared_from = n - r.count("num_kv_shared_layers", default=0, minimum=0, maximum=n)
    falcon_h1 = model_type == "falcon_h1"  # attention and Mamba-2 side by side in every layer
    layers = []
    for i, kind in enumerate(kinds):
        state = recurrent_state(r, kind, model_type, hidden) if kind in ("linear", "conv", "mamba") else None
        if falcon_h1 and kind == "full":
            state = recurrent_state(r, "mamba", model_type, hidden)
        if kind not in ("full", "sliding", "chunked"):
            layers.append(LayerSpec(kind, state=state))
            continue
        if i >= shared_from or kv[i] == 0:
            layers.append(LayerSpec("none", state=state))
            continue
        kv_i, k_dim, v_i = kv[i], head_dim, v_dim
        if kind == "full" and (global_kv or global_dim):
            kv_i, k_dim = global_kv or kv_i, global_dim or k_dim
            v_i = k_dim if global_dim else v_i
        if heads[i] % kv_i:
            # heads[i] > 0 here (0 % kv_i == 0), so a heads key is set and the fallback is never used
            kv_key = r.present(*_KV_KEYS) or "num_key_value_heads"
            heads_key = r.present(*_HEADS_KEYS) or "num_attention_heads"
            raise r.error(
                f"field {r.key(kv_key)} ({kv_i}) must divide {r.key(heads_key)} ({heads[i]})",
                "grouped-query attention gives each KV head a whole group of query heads",
            )
        if kind == "full":
            layers.append(LayerSpec("full", kv_i, k_dim, v_i, state=state))
        else:
            layers.append(LayerSpec("sliding", kv_i, k_dim, v_i, sliding_window=chunk if kind == "chunked" else window))
    first = next((layer for layer in layers if layer.has_attention), None)
    num_heads = heads[attention[0]] if attention else 0
    return layers, num_heads, first.num_kv_heads if first else 0, head_dim


def _intermediate(r: ConfigReader, default: int | None) -> int | None:
    """The MLP width. LFM2 configs give ``block_ff_dim`` with ``block_auto_adjust_ff_dim``: the
    width used is 2/3 of it, times ``block_ffn_dim_multiplier``, rounded up to
    ``block_multiple_of`` (transformers' Lfm2MLP; LFM2-1.2B: 12,288 -> 8,192)."""
    per_layer = r.cfg.get("intermediate_size")
    if isinstance(per_layer, list) and per_layer:  # one width per layer (Gemma 3n): the widest prices the MLPs
        widths = r.per_layer(("intermediate_size",), len(per_layer))
        assert widths is not None  # the key is set: per_layer returns its list
        return max(widths)
    width = r.count("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim", "block_ff_dim", default=default)
    if width is not None and r.cfg.get("block_auto_adjust_ff_dim"):
        width = int(2 * width / 3)
        multiplier = r.cfg.get("block_ffn_dim_multiplier")
        if isinstance(multiplier, (int, float)) and not isinstance(multiplier, bool) and 0 < multiplier < 1e6:
            width = int(multiplier * width)
        multiple = r.count("block_multiple_of", default=1)
        width = multiple * -(-width // multiple)
    return width


def _derived_max_model_len(r: ConfigReader, model_type: str, max_len: int | None) -> int | None:
    """The longest request vLLM accepts (tokens), from its ``_get_and_verify_max_len``: the config's
    length, times ``rope_scaling.factor`` for rope types other than llama3, longrope and su, with
    yarn scaling ``original_max_position_embeddings`` instead; Gemma 3's length is already scaled.
    None when the config names no length (vLLM then assumes 2048)."""
    rope = r.mapping("rope_scaling") or r.mapping("rope_parameters")  # transformers 5's key
    if max_len is None or not rope or model_type.startswith("gemma3"):
        return max_len
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in ("default", "llama3", "longrope", "su"):
        return max_len
    factor = 1.0 if rope.get("factor") is None else rope["factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < MAX_SIZE:
        raise r.error(f"field rope_scaling.factor must be a number > 0 (got {factor!r})")
    if rope_type == "yarn":
        max_len = r.within(rope).count("original_max_position_embeddings", default=max_len)
    return min(int(max_len * factor), MAX_SIZE)


def _moe(r: ConfigReader, model_type: str, num_layers: int) -> MoEDims | None:
    def count(*keys, default=None):
        return r.count(*keys, default=default, minimum=0)

    num_experts = count("n_routed_experts", "num_local_experts", "num_experts")
    if not num_experts:
        return None
    first_dense = count("first_k_dense_replace")
    if first_dense is not None:  # DeepSeek: dense MLP in the first k layers
        freq = count("moe_layer_freq") or 1
        moe_layers = tuple(i for i in range(num_layers) if i >= first_dense and i % freq == 0)
    else:  # Qwen-MoE: mlp_only_layers and decoder_sparse_step; Mixtral, gpt-oss: every layer
        dense = set(r.cfg.get("mlp_only_layers") or [])
        step = count("decoder_sparse_step") or 1
        moe_layers = tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
    return MoEDims(
        num_experts=num_experts,
        expert_intermediate_size=count("moe_intermediate_size", "intermediate_size", default=0),
        num_shared_experts=count("n_shared_experts", default=0),
        shared_expert_intermediate_size=count("shared_expert_intermediate_size", default=0),
        moe_layers=moe_layers,
        expert_bias=model_type == "gpt_oss",
        experts_per_token=r.count(
            "num_experts_per_tok", "experts_per_token", default=0, minimum=0, maximum=num_experts
        ),
    )


def _weight_bits(r: ConfigReader, quant: dict[str, Any] | None) -> float | None:
    """Bits per weight of a quantized checkpoint, scales included where the format fixes them."""
    if not quant:
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return 8.0
    if method == "mxfp4":  # 4-bit values + one 8-bit scale per 32 (OCP microscaling format): 4.25
        return FP4_WEIGHT_DTYPES["mxfp4"].bits_per_weight
    if method.startswith("modelopt") and str(quant.get("quant_algo", "")).upper() == "NVFP4":
        return FP4_WEIGHT_DTYPES["nvfp4"].bits_per_weight  # NVIDIA ModelOpt NVFP4: one FP8 scale per 16: 4.5
    if quant.get("bits"):
        return float(r.within(quant).count("bits", maximum=32))
    if quant.get("load_in_4bit"):
        return 4.0
    if quant.get("load_in_8bit"):
        return 8.0
    return None
