"""Paged attention: the metadata both backends read, and backend selection.

A backend is a module with two functions of identical signature (``torch_ref`` and ``triton_ops``):

``write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale=1.0, v_scale=1.0) -> None``
    key, value: [num_tokens, num_kv_heads, head_dim] (model dtype).
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim] (KV cache dtype), written in place.
    slot_mapping: [num_tokens] int64; token i goes to block ``slot // block_size``, offset ``slot % block_size``.
    For an fp8 cache the stored value is ``fp8(x / scale)``; other dtypes ignore the scales.

``paged_attention(query, k_cache, v_cache, meta, scale, k_scale=1.0, v_scale=1.0) -> Tensor``
    query: [num_tokens, num_heads, head_dim]; returns [num_tokens, num_heads, head_dim] in query's dtype.
    Causal attention of each sequence's new tokens over its whole context, read from the cache
    through ``meta.block_tables`` (the new tokens' K/V are written before the call). GQA: query head
    h reads KV head ``h // (num_heads // num_kv_heads)``. ``scale`` is the softmax scale (1/sqrt(head_dim)).

Batch layout (the runner guarantees it)::

    flattened tokens: | d0 | d1 | d2 | p0 p0 p0 p0 | p1 p1 |     decodes first, then prefills
    query_start_loc:  0    1    2    3             7       9
    seq_lens[i]:      context after this step = computed before + new tokens
    token j of sequence i sits at position seq_lens[i] - query_len_i + j and sees positions <= its own.
"""

from __future__ import annotations

import os
from types import ModuleType

import torch

from engine.attention.metadata import AttentionMetadata
from engine.config import SettingError

__all__ = ["AttentionMetadata", "InterpreterRequired", "get_attention_backend", "resolve_backend_name"]


class InterpreterRequired(SettingError, RuntimeError):
    """The triton backend on a CPU without Triton's interpreter (TRITON_INTERPRET=1)."""


def resolve_backend_name(name: str, device: torch.device) -> str:
    """``auto`` -> ``triton`` on CUDA, ``torch`` elsewhere."""
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return name


def get_attention_backend(name: str, device: torch.device) -> ModuleType:
    """Return the backend module for ``name`` (``torch`` | ``triton`` | ``auto``) on ``device``.

    Raises:
        RuntimeError: one line, for ``triton`` on CPU without ``TRITON_INTERPRET=1`` (Triton has no
            CPU driver; its interpreter must be switched on before triton is first imported).
        ValueError: for an unknown name.
    """
    name = resolve_backend_name(name, device)
    if name == "torch":
        from engine.attention import torch_ref

        return torch_ref
    if name == "triton":
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise InterpreterRequired(
                "attention_backend",
                "triton on CPU needs the Triton interpreter: "
                "set TRITON_INTERPRET=1 before starting (or use attention_backend torch)",
            )
        from engine.attention import triton_ops

        return triton_ops
    raise SettingError("attention_backend", f"must be auto, torch or triton (got {name!r})")
