"""Meta's original ``params.json`` (the consolidated.*.pth checkpoints of Llama 2/3) mapped onto
Hugging Face config keys, so that ``ModelSpec.from_hf_config`` reads it; errors name Meta's keys.

Keys (Meta's llama ``ModelArgs``): ``dim``, ``n_layers``, ``n_heads``, ``n_kv_heads`` (absent:
as many as ``n_heads``), ``vocab_size``, ``multiple_of``, ``ffn_dim_multiplier``. The MLP width is
Meta's own rule (llama/model.py ``FeedForward``): ``int(2 x 4 x dim / 3)``, times
``ffn_dim_multiplier`` when set, rounded up to a multiple of ``multiple_of`` (Llama-3-8B:
4096 -> 14,336). The file names no dtype (Meta ships bf16 weights) and no context length (vLLM
then assumes 2048 unless ``max_model_len`` is given).
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

# params.json key -> Hugging Face key
_KEYS = {
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "vocab_size": "vocab_size",
}


def is_meta_params(config: dict[str, Any]) -> bool:
    """A params.json: Meta's ``n_layers`` and ``dim``, and none of a config.json's keys."""
    return "n_layers" in config and "dim" in config and "num_hidden_layers" not in config and "model_type" not in config


def meta_params_config(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(Hugging Face style config, Hugging Face key -> params.json key) of a params.json dict."""
    config: dict[str, Any] = {hf: params[meta] for meta, hf in _KEYS.items() if params.get(meta) is not None}
    names = {hf: meta for meta, hf in _KEYS.items()}
    dim, multiple = params.get("dim"), params.get("multiple_of")
    if _number(dim) and _number(multiple) and multiple >= 1:
        hidden = int(2 * 4 * dim / 3)
        if _number(params.get("ffn_dim_multiplier")):
            hidden = int(params["ffn_dim_multiplier"] * hidden)
        config["intermediate_size"] = int(multiple * math.ceil(hidden / multiple))
    config.update(model_type="llama", torch_dtype="bfloat16", tie_word_embeddings=False)
    return config, names


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
