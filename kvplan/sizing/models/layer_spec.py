"""The per-layer cache spec of a model: one :class:`LayerSpec` per decoder layer, read from a
Hugging Face config (GGUF metadata and Meta's params.json are first mapped onto its keys).

vLLM's per-layer KV cache spec is the model (vllm/v1/kv_cache_interface.py: one spec per
attention or Mamba layer). Layer kinds::

    full     K and V of every token                 num_kv_heads x (k_head_dim + v_head_dim) per token
    sliding  K and V of the last `sliding_window` tokens (also chunked attention: a chunk is at most its size)
    mla      one latent per token (DeepSeek MLA)     kv_lora_rank + qk_rope_head_dim per token
    linear   no per-token KV; a fixed state per request (Gated DeltaNet)
    mamba    no per-token KV; a fixed state per request (Mamba-1/2)
    conv     no per-token KV; a fixed conv state per request (LFM2 short convolution)
    none     no cache at all (an MLP-only block, a layer reading another layer's KV)

A layer may hold both (Falcon-H1 runs attention and Mamba side by side): kind ``full`` with a
``state``. Where each pattern comes from is named at the code that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.sizing.models.config_reader import ConfigReader
from kvplan.sizing.models.state_shapes import GatedDeltaNetState, Mamba1State, Mamba2State, ShortConvState, StateDims

ATTENTION_KINDS = ("full", "sliding", "mla")
# layer_types entries (transformers, vLLM and model repos spell them differently) -> kind
_TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "global_attention": "full",
    "full": "full",
    "global": "full",
    "sliding_attention": "sliding",
    "local_attention": "sliding",
    "sliding": "sliding",
    "local": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
    "conv": "conv",
    "short_conv": "conv",
    "mamba": "mamba",
    "mamba2": "mamba",
    "ssm": "mamba",
}
_GDN_MODEL_TYPES = ("qwen3_next", "qwen3_5")  # Gated DeltaNet hybrids (prefixes: qwen3_5_moe, qwen3_5_text)
_MAMBA_ONLY = ("mamba", "mamba2", "falcon_mamba")
_MAMBA_KEYS = ("mamba_n_heads", "mamba_num_heads", "mamba_d_state", "mamba_expand", "ssm_state_size")
# Nemotron-H's hybrid_override_pattern: one character per layer
_NEMOTRON_PATTERN = {"M": "mamba", "*": "full", "-": "none", "E": "none"}


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer's cache, before the KV dtype and tensor parallelism are applied.

    ``num_kv_heads``, ``k_head_dim`` and ``v_head_dim`` describe its K and V rows (0 for layers
    without attention; MLA: one head, ``k_head_dim`` the latent width, ``v_head_dim`` 0);
    ``sliding_window`` is set for sliding layers (tokens); ``state`` for layers with a fixed
    per-request state (see :mod:`kvplan.sizing.models.state_shapes`).
    """

    kind: str
    num_kv_heads: int = 0
    k_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int | None = None
    state: StateDims | None = None

    @property
    def has_attention(self) -> bool:
        return self.kind in ATTENTION_KINDS


def layer_kinds(r: ConfigReader, model_type: str, num_layers: int, window: int | None) -> list[str]:
    """Kind per layer before heads and states: ``layer_types`` when the config lists them, else the
    model family's pattern."""
    names = _listed_types(r, num_layers)
    if names is not None:
        kinds = [_TYPE_NAMES[n.lower()] for n in names]
        if r.present("linear_num_value_heads") is None and r.present(*_MAMBA_KEYS):
            # transformers 5 lists Granite-4.0-H's Mamba-2 layers as linear_attention
            kinds = ["mamba" if k == "linear" else k for k in kinds]
        if "chunked" in kinds:
            r.count(
                "attention_chunk_size", required=True, fix="chunked attention layers hold one chunk of that many tokens"
            )
        # Qwen2/Qwen3 configs list sliding layers that apply only with use_sliding_window
        return [("full" if window is None else "sliding") if k == "sliding" else k for k in kinds]
    if model_type.startswith(_GDN_MODEL_TYPES) or r.present("full_attention_interval"):
        # Qwen3NextConfig: layer i is full attention when (i + 1) % full_attention_interval == 0
        interval = r.count("full_attention_interval", default=4)
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(num_layers)]
    if r.present("hybrid_override_pattern"):
        return _nemotron_kinds(r, num_layers)
    if r.present("full_attn_idxs"):  # early LFM2 configs: attention at these indices, conv elsewhere
        full = r.cfg["full_attn_idxs"]
        if not (isinstance(full, list) and all(isinstance(i, int) and 0 <= i < num_layers for i in full)):
            raise r.error(f"field full_attn_idxs must list layer indices below {num_layers} (got {str(full)[:40]!r})")
        return ["full" if i in full else "conv" for i in range(num_layers)]
    if r.present("attn_layer_period"):  # Jamba: attention where i % period == offset, Mamba elsewhere
        period, offset = r.count("attn_layer_period"), r.count("attn_layer_offset", default=0, minimum=0)
        return ["full" if i % period == offset else "mamba" for i in range(num_layers)]
    if model_type in _MAMBA_ONLY:
        return ["mamba"] * num_layers
    return _window_kinds(r, model_type, num_layers, window)


def _listed_types(r: ConfigReader, num_layers: int) -> list[str] | None:
    layer_types = r.cfg.get("layer_types")
    if layer_types is None:
        return None
    if not (
        isinstance(layer_types, list)
        and len(layer_types) == num_layers
        and all(isinstance(t, str) for t in layer_types)
    ):
        got = f"{len(layer_types)} entries" if isinstance(layer_types, list) else repr(layer_types)[:40]
        raise r.error(
            f"field {r.key('layer_types')} must list one type per layer, {num_layers} strings such as "
            f"'full_attention' or 'sliding_attention' (got {got})"
        )
    unknown = sorted({t for t in layer_types if t.lower() not in _TYPE_NAMES})
    if unknown:
        raise r.error(
            f"field {r.key('layer_types')} holds unknown layer type {unknown[0]!r}",
            f"kvplan knows {', '.join(sorted(_TYPE_NAMES))}",
        )
    return layer_types


def _nemotron_kinds(r: ConfigReader, num_layers: int) -> list[str]:
    pattern = r.cfg["hybrid_override_pattern"]
    if not isinstance(pattern, str) or len(pattern) != num_layers or set(pattern) - set(_NEMOTRON_PATTERN):
        raise r.error(
            f"field hybrid_override_pattern must be {num_layers} characters of M (Mamba), * (attention), "
            f"- (MLP) or E (MoE) (got {str(pattern)[:40]!r})"
        )
    return [_NEMOTRON_PATTERN[c] for c in pattern]


def _window_kinds(r: ConfigReader, model_type: str, num_layers: int, window: int | None) -> list[str]:
    """Attention-only models: full, or sliding by the family's pattern."""
    if window is None:
        return ["full"] * num_layers
    pattern = r.count("sliding_window_pattern", "_sliding_window_pattern")
    if pattern is None and model_type.startswith("gemma3"):
        pattern = 6  # Gemma 3: five local layers, then one global (Gemma 3 technical report)
    if pattern is None and model_type == "gemma2":
        pattern = 2  # Gemma 2 alternates local and global layers, local first
    if pattern:
        return ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers)]
    first_window_layer = r.count("max_window_layers", minimum=0)
    if r.cfg.get("use_sliding_window") and first_window_layer is not None:
        # Qwen2/Qwen3: layers from max_window_layers on use the window (transformers' layer_types rule).
        return ["sliding" if i >= first_window_layer else "full" for i in range(num_layers)]
    return ["sliding"] * num_layers


def recurrent_state(r: ConfigReader, kind: str, model_type: str, hidden: int | None) -> StateDims:
    """The fixed state of a ``linear``, ``conv`` or ``mamba`` layer from the config's sizes.

    Raises:
        KvplanError: a size the state needs is missing or not a whole number.
    """
    ssm_dtype = r.cfg.get("mamba_ssm_cache_dtype") or r.cfg.get("mamba_ssm_dtype")
    if ssm_dtype is None and model_type.startswith("nemotron_h"):
        ssm_dtype = "float32"  # vLLM's NemotronHForCausalLMConfig: DEFAULT_MAMBA_SSM_CACHE_DTYPE
    ssm_dtype = str(ssm_dtype).removeprefix("torch.") if ssm_dtype not in (None, "auto") else None
    need = "it sizes the fixed per-request state of the recurrent layers"
    if kind == "linear":
        return GatedDeltaNetState(
            num_k_heads=r.count("linear_num_key_heads", required=True, fix=need),
            num_v_heads=r.count("linear_num_value_heads", required=True, fix=need),
            head_k_dim=r.count("linear_key_head_dim", required=True, fix=need),
            head_v_dim=r.count("linear_value_head_dim", required=True, fix=need),
            conv_kernel=r.count("linear_conv_kernel_dim", default=4),
            ssm_dtype=ssm_dtype,
        )
    if kind == "conv":  # vLLM's Lfm2ForCausalLM: short_conv_state_shape(hidden_size, conv_L_cache)
        conv_dim = r.count("conv_dim") or hidden
        if conv_dim is None:
            raise r.missing("hidden_size", need)
        return ShortConvState(conv_dim=conv_dim, conv_kernel=r.count("conv_L_cache", required=True, fix=need))
    heads = r.count("mamba_n_heads", "mamba_num_heads", *(("num_heads",) if model_type == "mamba2" else ()))
    expand = r.count("mamba_expand", "expand")
    intermediate = r.count(
        "mamba_d_ssm", "mamba_intermediate_size", *(("intermediate_size",) if model_type in _MAMBA_ONLY else ())
    )
    if intermediate is None and expand is not None and hidden is not None:
        intermediate = expand * hidden
    state = r.count("mamba_d_state", "ssm_state_size", "state_size", default=128 if heads else 16)
    conv = r.count("mamba_d_conv", "conv_kernel", default=4)
    if heads is not None:
        head_dim = r.count("mamba_d_head", "mamba_head_dim", *(("head_dim",) if model_type == "mamba2" else ()))
        if head_dim is None and intermediate is not None and intermediate % heads == 0:
            head_dim = intermediate // heads
        if head_dim is None:
            raise r.missing("mamba_d_head", need)
        return Mamba2State(
            intermediate_size=intermediate or heads * head_dim,
            n_groups=r.count("mamba_n_groups", "n_groups", default=1),
            num_heads=heads,
            head_dim=head_dim,
            state_size=state,
            conv_kernel=conv,
            ssm_dtype=ssm_dtype,
        )
    if intermediate is None:
        raise r.missing("mamba_expand", need)
    return Mamba1State(intermediate_size=intermediate, state_size=state, conv_kernel=conv, ssm_dtype=ssm_dtype)
