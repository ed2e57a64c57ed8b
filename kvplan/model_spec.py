"""ModelSpec: the architecture numbers a KV estimate needs, and the only reader of Hugging Face keys.

A spec comes from a bundled preset (``kvplan/data/models/*.json``: the published config.json of a
real model, found by short name or Hugging Face id, case-insensitively), from a user's config.json
(or a folder holding one), or from a GGUF file's metadata. Presets and user files go through the
same reader, :meth:`ModelSpec.from_hf_config`; GGUF metadata is first mapped onto those keys.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError

PRESETS_DIR = Path(__file__).parent / "data" / "models"

# Model types whose config class defaults tie_word_embeddings to False when the key is absent
# (transformers' LlamaConfig, MistralConfig, Qwen2Config, ...); the base class defaults to True.
_UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3"}
# Architectures with a two-matrix MLP (up, down) instead of a gated three-matrix one.
_PLAIN_MLP = {"falcon", "gpt_bigcode", "gpt2", "gpt_neox", "opt", "phi"}
# vLLM falls back to 2048 tokens when a config names no maximum length.
_DEFAULT_MAX_LEN = 2048
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
    checkpoint's torch dtype name; ``weight_bits`` is set for quantized checkpoints (fp8, AWQ, ...).
    The KV numbers are required; hidden, vocabulary and MLP sizes only when weights are counted.
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

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str) -> ModelSpec:
        """Read a Hugging Face config dict (config.json, or transformers 5's ``config.to_dict()``).

        Multimodal configs are read from their ``text_config``. The dtype key may be ``dtype`` or
        ``torch_dtype``.

        Raises:
            KvplanError: ``<name>: missing field <key>`` when a needed number is absent.
        """
        text = dict(config.get("text_config") or config)
        for key in ("torch_dtype", "dtype", "quantization_config"):
            if text.get(key) is None and config.get(key) is not None:
                text[key] = config[key]
        return _read(text, name)


def _read(cfg: dict[str, Any], name: str) -> ModelSpec:
    cfg = {**_CLASS_DEFAULTS.get(str(cfg.get("model_type", "")).lower(), {}), **cfg}

    def first(*keys: str, default: Any = None, required: bool = False) -> Any:
        for key in keys:
            if cfg.get(key) is not None:
                return cfg[key]
        if required:
            raise KvplanError(name, f"missing field {keys[0]}", "the config must set it")
        return default

    def count(*keys: str, default: Any = None, required: bool = False) -> int | None:
        """A size field as a whole number >= 1 (the first of ``keys`` present)."""
        value = first(*keys, default=default, required=required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1 or value != int(value):
            key = next((k for k in keys if cfg.get(k) is not None), keys[0])
            raise KvplanError(name, f"field {key} must be a whole number >= 1 (got {value!r})")
        return int(value)

    model_type = str(first("model_type", default="")).lower()
    num_layers = count("num_hidden_layers", "n_layer", "num_layers", "n_layers", required=True)
    hidden = count("hidden_size", "n_embd", "d_model", "dim")
    heads = count("num_attention_heads", "n_head", "num_heads", "n_heads", required=True)
    if cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
        kv_heads = 1  # multi-query attention (Falcon-7B, StarCoder); Falcon's own num_kv_heads is ignored then
    else:
        kv_heads = count("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", default=heads)
    head_dim = count("head_dim", "kv_channels")
    if head_dim is None and cfg.get("kv_lora_rank") is None:
        if hidden is None or hidden % heads:
            raise KvplanError(name, "missing field head_dim", "set head_dim, or a hidden_size that the heads divide")
        head_dim = hidden // heads
    mlp_default = 4 * hidden if hidden is not None and model_type in _PLAIN_MLP else None
    intermediate = count("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim", default=mlp_default)
    dtype = str(first("torch_dtype", "dtype", default="float32")).replace("torch.", "")
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
            qk_nope_head_dim=int(first("qk_nope_head_dim", default=0)),
            v_head_dim=count("v_head_dim", required=True),
            q_lora_rank=count("q_lora_rank"),
        )
    return ModelSpec(
        name=name,
        model_type=model_type,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim or 0,  # MLA layers use the latent sizes instead
        dtype=dtype,
        layer_kinds=_layer_kinds(cfg, model_type, num_layers, window),
        sliding_window=window,
        max_position_embeddings=count(
            "max_position_embeddings", "n_positions", "seq_length", "max_sequence_length", default=_DEFAULT_MAX_LEN
        ),
        tie_word_embeddings=bool(first("tie_word_embeddings", default=model_type not in _UNTIED_BY_DEFAULT)),
        gated_mlp=model_type not in _PLAIN_MLP,
        qkv_bias=bool(cfg.get("attention_bias") or cfg.get("bias") or cfg.get("qkv_bias") or model_type == "qwen2"),
        o_bias=bool(cfg.get("attention_bias") or cfg.get("bias")),
        hidden_size=hidden,
        vocab_size=count("vocab_size", "padded_vocab_size"),
        intermediate_size=intermediate,
        mla=mla,
        moe=_moe(cfg, model_type, num_layers),
        weight_bits=_weight_bits(cfg.get("quantization_config")),
    )


def _layer_kinds(cfg: dict[str, Any], model_type: str, num_layers: int, window: Any) -> tuple[str, ...]:
    """Attention kind per layer: an explicit ``layer_types`` list, else the model family's pattern."""
    if window is None:
        return ("full",) * num_layers
    if cfg.get("layer_types"):
        return tuple("sliding" if str(t).startswith("sliding") else "full" for t in cfg["layer_types"][:num_layers])
    pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern")
    if pattern is None and model_type.startswith("gemma3"):
        pattern = 6  # Gemma 3: five local layers, then one global (Gemma 3 technical report)
    if pattern is None and model_type == "gemma2":
        pattern = 2  # Gemma 2 alternates local and global layers, local first
    if pattern:
        return tuple("full" if (i + 1) % int(pattern) == 0 else "sliding" for i in range(num_layers))
    if cfg.get("use_sliding_window") and cfg.get("max_window_layers") is not None:
        # Qwen2/Qwen3: layers from max_window_layers on use the window (transformers' layer_types rule).
        return tuple("sliding" if i >= cfg["max_window_layers"] else "full" for i in range(num_layers))
    return ("sliding",) * num_layers


def _moe(cfg: dict[str, Any], model_type: str, num_layers: int) -> MoEDims | None:
    num_experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    if not num_experts:
        return None
    if cfg.get("first_k_dense_replace") is not None:  # DeepSeek: dense MLP in the first k layers
        freq = int(cfg.get("moe_layer_freq") or 1)
        k = int(cfg["first_k_dense_replace"])
        moe_layers = tuple(i for i in range(num_layers) if i >= k and i % freq == 0)
    else:  # Qwen-MoE: mlp_only_layers and decoder_sparse_step; Mixtral, gpt-oss: every layer
        dense = set(cfg.get("mlp_only_layers") or [])
        step = int(cfg.get("decoder_sparse_step") or 1)
        moe_layers = tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
    return MoEDims(
        num_experts=int(num_experts),
        expert_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0),
        num_shared_experts=int(cfg.get("n_shared_experts") or 0),
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        moe_layers=moe_layers,
        expert_bias=model_type == "gpt_oss",
    )


def _weight_bits(quant: dict[str, Any] | None) -> float | None:
    """Bits per weight of a quantized checkpoint, scales included where the format fixes them."""
    if not quant:
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return 8.0
    if method == "mxfp4":
        return 4.25  # 4-bit values + one 8-bit scale per 32 (OCP microscaling format)
    if quant.get("bits"):
        return float(quant["bits"])
    if quant.get("load_in_4bit"):
        return 4.0
    if quant.get("load_in_8bit"):
        return 8.0
    return None


@lru_cache(maxsize=1)
def _catalog() -> dict[str, Path]:
    """Lower-cased short name, Hugging Face id and aliases -> preset file."""
    index: dict[str, Path] = {}
    for path in sorted(PRESETS_DIR.glob("*.json")):
        entry = json.loads(path.read_text())
        for key in (path.stem, entry["name"], entry["hf_id"], *entry.get("aliases", [])):
            index[key.lower()] = path
    return index


def preset_names() -> list[str]:
    """Short names of the bundled presets."""
    return sorted(path.stem for path in PRESETS_DIR.glob("*.json"))


def load_preset(name: str) -> tuple[ModelSpec, dict[str, Any]]:
    """A preset's spec and its catalog entry (name, hf_id, source, config).

    Raises:
        KvplanError: an unknown name, with the closest known names.
    """
    path = _catalog().get(name.lower())
    if path is None:
        close = difflib.get_close_matches(name.lower(), list(_catalog()), n=3, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(preset_names())}"
        raise KvplanError("--model", f"unknown model {name!r}", f"{hint}; or give a config.json or .gguf path")
    entry = json.loads(path.read_text())
    return ModelSpec.from_hf_config(entry["config"], entry["name"]), entry


def load_model_spec(model: str) -> ModelSpec:
    """A ModelSpec from a preset name or Hugging Face id (case-insensitive), a config.json file,
    a folder holding config.json (or one .gguf), or a .gguf file.

    Raises:
        KvplanError: unknown name, missing or unreadable file, or a config missing a needed field.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return _from_json(path / "config.json", path.name)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _from_gguf(ggufs[0])
        raise KvplanError(str(path), "holds no config.json (nor exactly one .gguf file)")
    if path.is_file():
        return _from_gguf(path) if path.suffix == ".gguf" else _from_json(path, path.parent.name or path.stem)
    if path.suffix in (".json", ".gguf"):
        raise KvplanError(str(path), "no such file")
    return load_preset(model)[0]


def _from_json(path: Path, fallback_name: str) -> ModelSpec:
    try:
        config = json.loads(path.read_text())
    except OSError as err:
        raise KvplanError(str(path), f"cannot read: {err.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise KvplanError(str(path), f"not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise KvplanError(str(path), "not a config.json object")
    name = str(config.get("_name_or_path") or fallback_name)
    try:
        return ModelSpec.from_hf_config(config, name)
    except KvplanError as err:  # name the file the user gave, not the model
        raise KvplanError(str(path), err.problem, err.fix) from None


def _from_gguf(path: Path) -> ModelSpec:
    """Map GGUF metadata (``<arch>.block_count``, ``<arch>.attention.head_count_kv``, ...) onto
    Hugging Face keys. GGUF names no torch dtype: the engine serves it in bfloat16."""
    import gguf  # numpy-only; kept out of the import path of presets and config.json files

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as err:  # the reader raises ValueError, struct or numpy errors on bad files
        first_line = (str(err).splitlines() or [type(err).__name__])[0]
        raise KvplanError(str(path), f"not a readable GGUF file ({first_line})") from None

    def meta(key: str) -> Any:
        field = reader.fields.get(key)
        if field is None:
            return None
        value = field.contents()
        return max(value) if isinstance(value, list) and value and isinstance(value[0], int) else value

    arch = meta("general.architecture")
    if not arch:
        raise KvplanError(str(path), "missing field general.architecture")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    config = {
        "model_type": arch,
        "num_hidden_layers": meta(f"{arch}.block_count"),
        "hidden_size": meta(f"{arch}.embedding_length"),
        "num_attention_heads": meta(f"{arch}.attention.head_count"),
        "num_key_value_heads": meta(f"{arch}.attention.head_count_kv"),
        "head_dim": meta(f"{arch}.attention.key_length"),
        "intermediate_size": meta(f"{arch}.feed_forward_length"),
        "vocab_size": meta(f"{arch}.vocab_size") or (len(tokens.data) if tokens else None),
        "max_position_embeddings": meta(f"{arch}.context_length"),
        "sliding_window": meta(f"{arch}.attention.sliding_window"),
        "kv_lora_rank": meta(f"{arch}.attention.kv_lora_rank"),
        "qk_rope_head_dim": meta(f"{arch}.rope.dimension_count"),
        "num_local_experts": meta(f"{arch}.expert_count"),
        "moe_intermediate_size": meta(f"{arch}.expert_feed_forward_length"),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
        "torch_dtype": "bfloat16",
    }
    for gguf_key, hf_key in (("block_count", "num_hidden_layers"), ("embedding_length", "hidden_size")):
        if config[hf_key] is None:
            raise KvplanError(str(path), f"missing field {arch}.{gguf_key}")
    return ModelSpec.from_hf_config(config, str(meta("general.name") or path.stem))
