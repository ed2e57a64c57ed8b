"""Reference paged attention in plain torch: the engine's default path on CPU, any device.

The cache is a pool of blocks ``[num_blocks, block_size, num_kv_heads, head_dim]``; a sequence's
context is the concatenation of the blocks its block table names, cut at ``seq_len``::

    block_table[i] = [7, 2, 5]   block_size 4, seq_len 10
    context:  blk7[0:4] | blk2[0:4] | blk5[0:2]        (blk5[2:4] is unused: partial last block)

Decodes (the first ``meta.num_decodes`` sequences, one new token each) run batched, with no
Python loop over sequences: one index_select gathers their blocks, sorted by length into a few
groups, each viewed as a padded ``[n, kv_heads, max_len, head_dim]`` tensor for one masked
``scaled_dot_product_attention`` call. Prefills (whole or chunked) run one sequence at a time with
a causal mask shifted by the context already in the cache. The cache must hold finite values in
unused slots (a masked score has weight 0, but 0 * NaN is NaN): allocate it with zeros.

FP8 (float8_e4m3fn) caches store ``fp8(x / scale)``; on read the fp8 -> model-dtype cast is
exact, and the per-tensor scales are folded into the math instead of into the data:
``softmax(q . (k_scale * k8) * s) = softmax(q . k8 * (s * k_scale))`` and
``p . (v_scale * v8) = v_scale * (p . v8)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn value (OCP FP8 spec, E4M3)
# Decodes are sorted by length and padded per group of DECODE_GROUP, not to the batch's longest
# context; a group is merged into the previous one while that adds <= MERGE_MAX_PADDING padded
# (sequence, position) pairs, since every extra attention call has a fixed cost. Measured per
# layer, bf16, SmolLM2 shapes, 32 decodes, 2 threads: contexts 100-350 with 4 near 1000: 1.5 ms
# against 2.2 ms padded to the longest; contexts uniform in 100-1000: 2.4-2.9 ms against 2.5 ms.
DECODE_GROUP = 8
MERGE_MAX_PADDING = 4096


def quantize_to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Values as the cache stores them: ``fp8(clamp(x / scale, +-448))`` for fp8, else ``x`` cast.

    x: any shape, model dtype. scale: per-tensor float (ignored unless ``cache_dtype`` is fp8).
    The division runs in fp32 so a bf16 input is not rounded twice. Both backends store exactly
    these bytes (the Triton backend calls this under the interpreter, where its own casts are wrong).
    """
    if cache_dtype == FP8_DTYPE:
        return (x.float() / float(scale)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x.to(cache_dtype)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store this step's K/V in the paged cache, in place.

    key, value: [num_tokens, num_kv_heads, head_dim]. k_cache, v_cache:
    [num_blocks, block_size, num_kv_heads, head_dim]. slot_mapping: [num_tokens] int64; slot s is
    block ``s // block_size``, offset ``s % block_size`` (the flat index into the first two dims).
    """
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    for x, cache, scale in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
        # Index-put on the flat [num_slots, kv_heads, head_dim] view: index_copy_ has no fp8 kernel.
        cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = quantize_to_cache(x, cache.dtype, scale)


def _gather_context(
    cache: torch.Tensor, block_ids: torch.Tensor, n: int, max_len: int, dtype: torch.dtype
) -> torch.Tensor:
    """Blocks ``block_ids`` [n * num_blocks] (n tables of ceil(max_len / block_size) blocks, flat)
    -> [n, num_kv_heads, max_len, head_dim] in ``dtype``; positions past a sequence's end hold junk.

    index_select on the block axis copies whole blocks; it ran ~2x faster on the CPU machine than
    advanced indexing with a 2-D table (SmolLM2 decode shapes)."""
    return _context_view(cache.index_select(0, block_ids).to(dtype), n, max_len)


def _context_view(blocks: torch.Tensor, n: int, max_len: int) -> torch.Tensor:
    """[n * num_blocks, block_size, kv_heads, d] gathered blocks -> [n, kv_heads, max_len, d] view."""
    return blocks.view(n, -1, *blocks.shape[2:])[:, :max_len].transpose(1, 2)


def _table_prefix(block_tables: torch.Tensor, max_len: int, block_size: int) -> torch.Tensor:
    """The first ceil(max_len / block_size) entries of each table, flattened."""
    return block_tables[:, : -(-max_len // block_size)].flatten()


@dataclass(frozen=True)
class _DecodeGroup:
    """``n`` decodes that share one attention call, padded to ``max_len`` positions
    (``num_blocks`` blocks each). mask: [n, 1, 1, max_len], True inside each context."""

    n: int
    max_len: int
    num_blocks: int
    mask: torch.Tensor


@dataclass(frozen=True)
class _DecodePlan:
    """order: [nd] batch rows sorted by context length (None: one group, batch order).
    block_ids: every group's tables cut to its ``max_len``, concatenated in group order, so one
    index_select gathers all groups. Few, large ops matter here: on a loaded 2-core machine each
    parallel op can wait a scheduler slice (~10 ms measured) for its second thread."""

    order: torch.Tensor | None
    block_ids: torch.Tensor
    groups: list[_DecodeGroup]


def _decode_plan(meta: AttentionMetadata, block_size: int) -> _DecodePlan:
    """Sort the decodes by context length, cut them into groups of ``DECODE_GROUP``, and merge a
    group into the previous one while that adds at most ``MERGE_MAX_PADDING`` padded positions.

    Every layer of a step reads the same metadata object, so the plan is built once per step and
    kept in ``meta.backend_plans`` (saves ~0.3-0.6 ms per layer at 32 decodes)."""
    key = ("torch_ref.decode", block_size)
    if key in meta.backend_plans:
        return meta.backend_plans[key]
    nd = meta.num_decodes
    lens = meta.seq_lens[:nd].tolist()
    order_list = sorted(range(nd), key=lens.__getitem__)
    sorted_lens = [lens[i] for i in order_list]
    bounds: list[tuple[int, int]] = []
    for s in range(0, nd, DECODE_GROUP):
        e = min(s + DECODE_GROUP, nd)
        if bounds:
            first, last = bounds[-1]
            # Merging pads every row of the previous group up to this group's longest context.
            if (last - first) * (sorted_lens[e - 1] - sorted_lens[last - 1]) <= MERGE_MAX_PADDING:
                bounds[-1] = (first, e)
                continue
        bounds.append((s, e))
    seq_lens, tables, order = meta.seq_lens[:nd], meta.block_tables[:nd], None
    if len(bounds) > 1:
        order = torch.tensor(order_list, device=seq_lens.device)
        seq_lens, tables = seq_lens[order], tables[order]
    groups, block_ids = [], []
    for s, e in bounds:
        max_len = sorted_lens[e - 1]
        positions = torch.arange(max_len, device=seq_lens.device)
        mask = (positions[None, :] < seq_lens[s:e, None])[:, None, None, :]
        groups.append(_DecodeGroup(e - s, max_len, -(-max_len // block_size), mask))
        block_ids.append(_table_prefix(tables[s:e], max_len, block_size))
    plan = _DecodePlan(order, torch.cat(block_ids), groups)
    meta.backend_plans[key] = plan
    return plan


def _decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    score_scale: float,
    out: torch.Tensor,
) -> None:
    """One-token queries [nd, num_heads, d] of the first nd sequences -> ``out`` [nd, num_heads, d].

    Per group of ``_decode_plan``, K/V are viewed as a tensor padded only to the group's longest
    context, then one masked ``scaled_dot_product_attention`` call serves the group. Each KV head's
    query group lies along the query-length axis ([n, kv_heads, group, d]), so KV is never
    repeated for GQA (``enable_gqa=True`` measured ~5x slower here for one-token queries).
    """
    _, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    plan = _decode_plan(meta, k_cache.shape[1])
    q = query if plan.order is None else query.index_select(0, plan.order)
    k_blocks = k_cache.index_select(0, plan.block_ids).to(query.dtype)
    v_blocks = v_cache.index_select(0, plan.block_ids).to(query.dtype)
    outs, row, blk = [], 0, 0
    for grp in plan.groups:
        k = _context_view(k_blocks[blk : blk + grp.n * grp.num_blocks], grp.n, grp.max_len)
        v = _context_view(v_blocks[blk : blk + grp.n * grp.num_blocks], grp.n, grp.max_len)
        # Query head h = kv_head * group + g reads KV head h // group.
        qg = q[row : row + grp.n].view(grp.n, num_kv_heads, num_heads // num_kv_heads, head_dim)
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=grp.mask, scale=score_scale)
        outs.append(o.reshape(grp.n, num_heads, head_dim))
        row, blk = row + grp.n, blk + grp.n * grp.num_blocks
    o = torch.cat(outs) if len(outs) > 1 else outs[0]
    if plan.order is None:
        out.copy_(o)
    else:
        out.index_copy_(0, plan.order, o)


def _prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    score_scale: float,
    out: torch.Tensor,
) -> None:
    """Sequences ``num_decodes..num_seqs`` (whole prompts or chunks), one at a time: their rows of
    query [num_tokens, num_heads, d] -> the same rows of ``out``."""
    group = query.shape[1] // k_cache.shape[2]
    starts = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    for i in range(meta.num_decodes, meta.num_seqs):
        start, end, seq_len = starts[i], starts[i + 1], seq_lens[i]
        query_len = end - start
        block_ids = _table_prefix(meta.block_tables[i : i + 1], seq_len, k_cache.shape[1])
        k = _gather_context(k_cache, block_ids, 1, seq_len, query.dtype)
        v = _gather_context(v_cache, block_ids, 1, seq_len, query.dtype)
        q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, num_heads, query_len, d]
        # Token j sits at position seq_len - query_len + j and sees positions <= its own.
        q_pos = torch.arange(seq_len - query_len, seq_len, device=query.device)
        k_pos = torch.arange(seq_len, device=query.device)
        mask = k_pos[None, :] <= q_pos[:, None]  # [query_len, seq_len]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=score_scale, enable_gqa=group > 1)
        out[start:end] = o[0].transpose(0, 1)


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged context.

    query: [num_tokens, num_heads, head_dim] in the batch layout of ``engine.attention``
    (decodes first). k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]; the new
    tokens' K/V must already be written. scale: softmax scale (1/sqrt(head_dim)).
    k_scale, v_scale: fp8 dequantisation scales (ignored for other cache dtypes).
    Returns [num_tokens, num_heads, head_dim] in query's dtype.
    """
    is_fp8 = k_cache.dtype == FP8_DTYPE
    score_scale = scale * float(k_scale) if is_fp8 else scale
    out_scale = float(v_scale) if is_fp8 else 1.0
    out = torch.empty_like(query)
    nd = meta.num_decodes

    if nd > 0:
        _decode_attention(query[:nd], k_cache, v_cache, meta, score_scale, out[:nd])
    if meta.num_seqs > nd:
        _prefill_attention(query, k_cache, v_cache, meta, score_scale, out)
    if out_scale != 1.0:
        out.mul_(out_scale)
    return out
