"""One request's KV blocks out of a ``KVCache`` as bytes, and into another's blocks.

Layout of a payload of n blocks (the blocks in the order given, every layer)::

    for layer in layers: K[block_ids] then V[block_ids], each [n, block_size, num_kv_heads, head_dim]
    len(payload) = n x KVCache.bytes_per_block

The two caches must agree on layers, block_size, KV heads, head_dim and dtype (``layout_of``);
fp8 scales are per deployment (both workers calibrated alike), not carried.
"""

from __future__ import annotations

import torch

from engine.kv_cache import KVCache


def layout_of(cache: KVCache) -> tuple:
    """What two caches must share for a payload to move between them: (layers, block shape, dtype)."""
    return (len(cache.k_caches), tuple(cache.k_caches[0].shape[1:]), str(cache.dtype))


def export_blocks(cache: KVCache, block_ids: list[int] | tuple[int, ...]) -> bytes:
    """The K/V of ``block_ids`` (all layers) as one bytes payload of len(block_ids) x bytes_per_block."""
    index = torch.tensor(block_ids, dtype=torch.int64, device=cache.k_caches[0].device)
    parts = []
    for k, v in zip(cache.k_caches, cache.v_caches):
        for t in (k, v):
            parts.append(t.index_select(0, index).contiguous().view(torch.uint8).reshape(-1))
    return torch.cat(parts).cpu().numpy().tobytes()


def import_blocks(cache: KVCache, block_ids: list[int] | tuple[int, ...], payload: bytes) -> None:
    """Write ``payload`` (from ``export_blocks`` of a cache with the same layout) into ``block_ids``.

    Raises:
        ValueError: a payload whose length is not len(block_ids) x bytes_per_block.
    """
    n = len(block_ids)
    if len(payload) != n * cache.bytes_per_block:
        raise ValueError(f"payload: {len(payload)} bytes for {n} blocks of {cache.bytes_per_block} bytes")
    device = cache.k_caches[0].device
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    index = torch.tensor(block_ids, dtype=torch.int64, device=device)
    offset = 0
    for k, v in zip(cache.k_caches, cache.v_caches):
        for t in (k, v):
            raw = t.view(torch.uint8)  # bytewise: index_copy_ has no kernel for every dtype (fp8)
            size = n * raw[0].numel()
            raw.index_copy_(0, index, flat[offset : offset + size].view(n, *raw.shape[1:]))
            offset += size
