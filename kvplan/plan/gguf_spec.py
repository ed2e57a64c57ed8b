"""GGUF metadata mapped onto Hugging Face config keys, so that ``ModelSpec.from_hf_config`` reads
GGUF files and config.json files alike.

The header is read by :mod:`kvplan.plan.gguf_reader`. Keys follow llama.cpp's GGUF naming (``<arch>.block_count``, ``<arch>.attention.head_count_kv``,
...; gguf-py's ``Keys``). Per-layer lists (a head count per layer) are reduced to their maximum,
the largest KV a layer holds. GGUF names no torch dtype: the engine serves it in bfloat16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.plan.gguf_reader import read_gguf_header

GGUF_MAGIC = b"GGUF"  # the first 4 bytes of every GGUF file (gguf-py's GGUF_MAGIC, little-endian)


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


def read_gguf_config(path: Path) -> tuple[dict[str, Any], str]:
    """(Hugging Face style config dict, model name) of a GGUF file.

    Raises:
        KvplanError: not a readable GGUF file, or metadata without the architecture, block count or
            embedding length (named by their GGUF keys).
    """
    header = read_gguf_header(path)

    def meta(key: str) -> Any:
        value = header.metadata.get(key)
        return max(value) if isinstance(value, list) and value and isinstance(value[0], int) else value

    arch = meta("general.architecture")
    if not arch:
        raise KvplanError("", "missing field general.architecture", source=str(path))
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    config = {
        "model_type": arch,
        "num_hidden_layers": meta(f"{arch}.block_count"),
        "hidden_size": meta(f"{arch}.embedding_length"),
        "num_attention_heads": meta(f"{arch}.attention.head_count"),
        "num_key_value_heads": meta(f"{arch}.attention.head_count_kv"),
        "head_dim": meta(f"{arch}.attention.key_length"),
        "intermediate_size": meta(f"{arch}.feed_forward_length"),
        "vocab_size": meta(f"{arch}.vocab_size") or (len(tokens) if tokens else None),
        "max_position_embeddings": meta(f"{arch}.context_length"),
        "sliding_window": meta(f"{arch}.attention.sliding_window"),
        "kv_lora_rank": meta(f"{arch}.attention.kv_lora_rank"),
        "qk_rope_head_dim": meta(f"{arch}.rope.dimension_count"),
        "num_local_experts": meta(f"{arch}.expert_count"),
        "moe_intermediate_size": meta(f"{arch}.expert_feed_forward_length"),
        "tie_word_embeddings": "output.weight" not in header.tensor_names,
        "torch_dtype": "bfloat16",
    }
    for gguf_key, hf_key in (("block_count", "num_hidden_layers"), ("embedding_length", "hidden_size")):
        if config[hf_key] is None:
            raise KvplanError("", f"missing field {arch}.{gguf_key}", source=str(path))
    return config, str(meta("general.name") or path.stem)
