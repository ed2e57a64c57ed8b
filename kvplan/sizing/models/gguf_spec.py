"""GGUF metadata mapped onto Hugging Face config keys, so that ``ModelSpec.from_hf_config`` reads
GGUF files and config.json files alike; errors name the GGUF key (``key_names``).

The header is read by :mod:`kvplan.sizing.models.gguf_reader` (no tensors, no numpy). Keys follow
llama.cpp's GGUF naming (``<arch>.block_count``, ``<arch>.attention.head_count_kv``, ...;
gguf-py's ``Keys``). Per-layer arrays (a KV head count per layer, 0 on layers without
attention) stay per layer. Which layers are recurrent, and which attention layers slide, follows
llama.cpp (src/llama-model.cpp): Qwen3-Next/Qwen3.5 by ``full_attention_interval``; LFM2, Granite
hybrid, Nemotron-H and Jamba by 0 KV heads; Mamba models throughout; sliding layers by
``attention.sliding_window_pattern`` or the architecture's ``set_swa_pattern(n)`` (every n-th
layer global). GGUF names no cache dtype: llama.cpp's default cache type is f16, so GGUF models
are priced in fp16 (the same bytes as bf16).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.sizing.models.gguf_reader import read_gguf_header

GGUF_MAGIC = b"GGUF"  # the first 4 bytes of every GGUF file (gguf-py's GGUF_MAGIC, little-endian)
# llama.cpp's set_swa_pattern(n) per architecture: layer il is local when il % n < n - 1
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "gemma-embedding": 6, "cohere2": 4, "gpt-oss": 2, "exaone4": 4}
_GATED_DELTA_NET = ("qwen3next", "qwen35", "qwen35moe")
_MAMBA2 = ("mamba2", "granitehybrid", "nemotron_h", "nemotron_h_moe", "falcon-h1")
_MAMBA1 = ("mamba", "jamba")
_ZERO_KV_IS_MAMBA = ("granitehybrid", "nemotron_h", "nemotron_h_moe", "jamba")
_LFM2_L_CACHE = 3  # transformers' Lfm2Config default conv_L_cache, for files without shortconv.l_cache


def is_gguf(path: Path) -> bool:
    """A name ending in .gguf (any case), or a file starting with GGUF's magic whatever its name.
    An unreadable file is not GGUF here; the JSON reader then names the read error."""
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as file:
            return file.read(4) == GGUF_MAGIC
    except OSError:
        return False


def read_gguf_config(path: Path) -> tuple[dict[str, Any], str, dict[str, str]]:
    """(Hugging Face style config dict, model name, Hugging Face key -> GGUF key) of a GGUF file.

    Raises:
        KvplanError: not a readable GGUF file, or metadata without the architecture, block count or
            embedding length (named by their GGUF keys).
    """
    header = read_gguf_header(path, texts=False)  # the tokenizer's strings: only their count is read

    def raw(key: str) -> Any:
        return header.metadata.get(key)

    arch = raw("general.architecture")
    if not arch:
        raise KvplanError("", "missing field general.architecture", source=str(path))
    config: dict[str, Any] = {}
    names: dict[str, str] = {}

    def put(hf_key: str, gguf_key: str, value: Any = None) -> Any:
        """config[hf_key] = the value of ``<arch>.<gguf_key>`` (or ``value``); errors name the GGUF key."""
        names[hf_key] = f"{arch}.{gguf_key}"
        config[hf_key] = raw(f"{arch}.{gguf_key}") if value is None else value
        return config[hf_key]

    def get(gguf_key: str) -> Any:
        return raw(f"{arch}.{gguf_key}")

    for hf_key, gguf_key in (("num_hidden_layers", "block_count"), ("hidden_size", "embedding_length")):
        if put(hf_key, gguf_key) is None:
            raise KvplanError("", f"missing field {arch}.{gguf_key}", source=str(path))
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    ffn = get("feed_forward_length")
    config.update(
        model_type="falcon_h1" if arch == "falcon-h1" else arch,
        vocab_size=get("vocab_size") or (len(tokens) if tokens else None),
        tie_word_embeddings="output.weight" not in header.tensor_names,
        torch_dtype="float16",
    )
    put("num_attention_heads", "attention.head_count")
    put("num_key_value_heads", "attention.head_count_kv")
    put("max_position_embeddings", "context_length")
    put("intermediate_size", "feed_forward_length", max(ffn) if isinstance(ffn, list) and ffn else None)
    put("num_local_experts", "expert_count")
    put("moe_intermediate_size", "expert_feed_forward_length")
    put("num_kv_shared_layers", "attention.shared_kv_layers")
    _head_dims(config, put, get)
    _layer_types(arch, config, put, get)
    _states(arch, put, get)
    return {k: v for k, v in config.items() if v is not None}, str(raw("general.name") or path.stem), names


def _head_dims(config: dict, put, get) -> None:
    """K and V widths: MLA latents (``kv_lora_rank``; the *_mla lengths when the file has them),
    else key_length / value_length, with the *_swa lengths for sliding layers where given (then
    key_length is the global layers', Hugging Face's ``global_head_dim``)."""
    if put("kv_lora_rank", "attention.kv_lora_rank"):
        put("q_lora_rank", "attention.q_lora_rank")
        rope = put("qk_rope_head_dim", "rope.dimension_count")
        mla = get("attention.key_length_mla") is not None
        k = put("head_dim", "attention.key_length_mla" if mla else "attention.key_length")
        put("v_head_dim", "attention.value_length_mla" if mla else "attention.value_length")
        config["head_dim"] = None  # MLA caches the latent, not heads
        if isinstance(k, int) and isinstance(rope, int) and k >= rope:
            config["qk_nope_head_dim"] = k - rope
        return
    if get("attention.key_length_swa") is not None:
        put("head_dim", "attention.key_length_swa")
        put("v_head_dim", "attention.value_length_swa")
        put("global_head_dim", "attention.key_length")
        return
    put("head_dim", "attention.key_length")
    put("v_head_dim", "attention.value_length")


def _layer_types(arch: str, config: dict, put, get) -> None:
    """``layer_types`` from llama.cpp's per-architecture rules (see the module docstring)."""
    n = config["num_hidden_layers"]
    if not isinstance(n, int) or n < 1:
        return  # ModelSpec names the bad block_count
    kv = config.get("num_key_value_heads")
    zero_kv = [h == 0 for h in kv] if isinstance(kv, list) and len(kv) == n else [False] * n
    window = put("sliding_window", "attention.sliding_window")
    if arch in _GATED_DELTA_NET:
        interval = put("full_attention_interval", "full_attention_interval") or 4  # llama.cpp's default
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    elif arch in ("mamba", "mamba2"):
        types = ["mamba"] * n
    elif arch == "lfm2":
        types = ["conv" if zero else "full_attention" for zero in zero_kv]
    elif arch in _ZERO_KV_IS_MAMBA:
        types = ["mamba" if zero else "full_attention" for zero in zero_kv]
    elif window:
        pattern = put("sliding_window_pattern", "attention.sliding_window_pattern")
        if isinstance(pattern, list) and len(pattern) == n:
            local = [bool(p) for p in pattern]
        else:
            every = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) else _SWA_PATTERN.get(arch)
            local = [every is None or every == 0 or (every > 1 and i % every < every - 1) for i in range(n)]
        config.pop("sliding_window_pattern")
        types = ["sliding_attention" if is_local else "full_attention" for is_local in local]
    else:
        return
    config["layer_types"] = types


def _states(arch: str, put, get) -> None:
    """Recurrent-state sizes (ssm.* and shortconv.* keys) under the Hugging Face names the reader
    knows. Qwen3-Next in GGUF (llama.cpp's convert_hf_to_gguf.py): conv_kernel = linear conv
    kernel, state_size = key head dim, group_count = key heads, time_step_rank = value heads,
    inner_size = value heads x value head dim."""
    if arch in _GATED_DELTA_NET:
        put("linear_conv_kernel_dim", "ssm.conv_kernel")
        put("linear_key_head_dim", "ssm.state_size")
        put("linear_num_key_heads", "ssm.group_count")
        heads, inner = put("linear_num_value_heads", "ssm.time_step_rank"), get("ssm.inner_size")
        if isinstance(heads, int) and heads and isinstance(inner, int):
            put("linear_value_head_dim", "ssm.inner_size", inner // heads)
    elif arch == "lfm2":
        put("conv_L_cache", "shortconv.l_cache", get("shortconv.l_cache") or _LFM2_L_CACHE)
    elif arch in _MAMBA2 or arch in _MAMBA1:
        put("mamba_d_conv", "ssm.conv_kernel")
        inner = put("mamba_d_ssm", "ssm.inner_size")
        put("mamba_d_state", "ssm.state_size")
        if arch in _MAMBA2:
            heads = put("mamba_n_heads", "ssm.time_step_rank")
            put("mamba_n_groups", "ssm.group_count")
            if isinstance(heads, int) and heads and isinstance(inner, int):
                put("mamba_d_head", "ssm.inner_size", inner // heads)
