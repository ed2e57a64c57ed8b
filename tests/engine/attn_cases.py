"""Paged-attention test batches and the dense attention they are checked against.

A case is built from contiguous per-sequence K/V; the paged cache, the shuffled block tables and
the slot mapping are derived from it here, so the dense reference never touches the paged layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata

FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class PagedCase:
    """query [num_tokens, H, d] fp32; keys/values: per sequence [seq_len, kv_heads, d] fp32;
    k_cache/v_cache: [num_blocks, block_size, kv_heads, d] filled with junk, nothing written yet;
    context_slots: [sum(seq_len)] int64 slots of every context token (to fill the cache);
    meta: the batch's metadata (slot_mapping covers only the new tokens)."""

    query: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    context_slots: torch.Tensor
    meta: AttentionMetadata
    query_lens: list[int]


def make_case(
    seqs: list[tuple[int, int]],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cache_dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_blocks: int = 3,
) -> PagedCase:
    """seqs: (num_computed_tokens, query_len) per sequence; decodes (query_len 1) must come first.

    Blocks come from a random permutation of the pool (tables are neither contiguous nor sorted),
    and the pool has ``spare_blocks`` more blocks than needed, so stray reads hit junk.
    """
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in seqs]
    query_lens = [q for _, q in seqs]
    num_decodes = 0
    while num_decodes < len(seqs) and query_lens[num_decodes] == 1 and seqs[num_decodes][0] > 0:
        num_decodes += 1
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, cursor = [], 0
    for nb in blocks_per_seq:
        tables.append(perm[cursor : cursor + nb])
        cursor += nb
    max_blocks = max(blocks_per_seq)
    block_tables = torch.zeros(len(seqs), max_blocks, dtype=torch.int32)
    for i, t in enumerate(tables):
        block_tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)

    def slot(i: int, pos: int) -> int:
        return tables[i][pos // block_size] * block_size + pos % block_size

    keys = [torch.randn(n, num_kv_heads, head_dim, generator=g) for n in seq_lens]
    values = [torch.randn(n, num_kv_heads, head_dim, generator=g) for n in seq_lens]
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=g)
    new_slots = [slot(i, p) for i, (c, q) in enumerate(seqs) for p in range(c, c + q)]
    context_slots = [slot(i, p) for i, n in enumerate(seq_lens) for p in range(n)]
    junk = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=g) * 50
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(new_slots, dtype=torch.int64),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=block_tables,
        num_decodes=num_decodes,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    return PagedCase(
        query=query,
        keys=keys,
        values=values,
        k_cache=junk[0].to(cache_dtype),
        v_cache=junk[1].to(cache_dtype),
        context_slots=torch.tensor(context_slots, dtype=torch.int64),
        meta=meta,
        query_lens=query_lens,
    )


def stored(x: torch.Tensor, cache_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """What a cache of ``cache_dtype`` holds for ``x``, read back as fp64 and dequantised."""
    if cache_dtype == FP8:
        return (x.double() / scale).clamp(-448, 448).to(FP8).double() * scale
    return x.to(cache_dtype).double()


def dense_attention(case: PagedCase, scale: float, cache_dtype=torch.float32, k_scale=1.0, v_scale=1.0) -> torch.Tensor:
    """Plain causal softmax attention in fp64 over the contiguous K/V: [num_tokens, H, d]."""
    num_heads = case.query.shape[1]
    group = num_heads // case.keys[0].shape[1]
    out, start = [], 0
    for k, v, ql in zip(case.keys, case.values, case.query_lens):
        seq_len = k.shape[0]
        q = case.query[start : start + ql].double()
        start += ql
        k = stored(k, cache_dtype, k_scale).repeat_interleave(group, dim=1)  # [L, H, d]
        v = stored(v, cache_dtype, v_scale).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = torch.arange(seq_len - ql, seq_len)[:, None]
        k_pos = torch.arange(seq_len)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
    return torch.cat(out)


def fill_cache(backend, case: PagedCase, k_scale=1.0, v_scale=1.0) -> None:
    """Write every context token's K/V into the case's cache through ``backend.write_kv_cache``."""
    backend.write_kv_cache(
        torch.cat(case.keys),
        torch.cat(case.values),
        case.k_cache,
        case.v_cache,
        case.context_slots,
        k_scale,
        v_scale,
    )


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, in fp64."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max())


# A mixed batch: three decodes (one whose context fills its blocks exactly, one partial, one long),
# then a whole prefill, a chunk starting mid-block, a chunk starting on a block edge, a 1-token chunk.
MIXED = [(16, 1), (6, 1), (37, 1), (0, 11), (6, 9), (8, 5), (13, 1)]
