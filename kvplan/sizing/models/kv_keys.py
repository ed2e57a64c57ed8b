"""The config keys that give a model's KV heads, and the guard against the ones kvplan does not read.

The KV heads set the price of attention: a config whose KV-head key kvplan does not know would be
read as multi-head attention (as many KV heads as query heads), 4x too high for a model of 32 query
heads in 8 groups, and nothing would say so. So a key whose name speaks of KV heads or groups
(``num_kv_groups``, ``kv_heads``, ``num_query_groups`` (Megatron), ``attn_config.kv_n_heads`` (MPT,
DBRX)) that kvplan does not read stops the estimate with its name. Sub-configs of other towers
(``vision_config``, ``audio_config``) and ``quantization_config`` are not searched: their keys
do not size the language model's KV cache.
"""

from __future__ import annotations

import re
from typing import Any

from kvplan.errors import KvplanError

# Keys the reader takes the KV heads from, in this order (transformers' num_key_value_heads;
# Falcon's num_kv_heads and n_head_kv; ChatGLM's multi_query_group_num), plus Gemma 4's KV heads
# of its full-attention layers.
KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
READ_KEYS = frozenset((*KV_HEAD_KEYS, "num_global_key_value_heads"))
_SPEAKS_OF_KV = re.compile(r"(kv|key_?value).*(head|group)|(head|group).*(kv|key_?value)|query_?group", re.IGNORECASE)
_NOT_SEARCHED = re.compile(r"vision|audio|speech|quantization", re.IGNORECASE)


def unread_kv_key(config: dict[str, Any], read: frozenset[str] = READ_KEYS, path: str = "") -> str | None:
    """The first key (as a dotted path, ``attn_config.kv_n_heads``) of ``config`` or its nested
    mappings whose name speaks of KV heads or groups, that is set (not null) and not one of
    ``read`` (the keys the reader of this convention takes); None when there is none."""
    for key, value in config.items():
        name = f"{path}{key}"
        if isinstance(value, dict):
            if not _NOT_SEARCHED.search(str(key)):
                found = unread_kv_key(value, read, f"{name}.")
                if found is not None:
                    return found
        elif value is not None and str(key) not in read and _SPEAKS_OF_KV.search(str(key)):
            return name
    return None


def check_kv_keys(
    config: dict[str, Any], source: str, read: frozenset[str] = READ_KEYS, write_as: str = KV_HEAD_KEYS[0]
) -> None:
    """Raises KvplanError (from ``source``) naming :func:`unread_kv_key`'s key when there is one;
    the fix names ``write_as``, the key this convention's reader takes the KV heads from."""
    key = unread_kv_key(config, read)
    if key is not None:
        raise KvplanError(
            "",
            f"field {key} speaks of KV heads or groups, and kvplan does not read it",
            f"kvplan would otherwise price attention with as many KV heads as query heads; give the KV"
            f" head count as {write_as} in a copy of the file",
            source=source,
        )
