"""The Triton kernels of paged attention: cache write, decode and (chunked) prefill.

Called only through the checked wrappers of engine.attention.triton_ops, which pick the tiles and
the dtype path (native casts on a GPU; fp32 after every load under the interpreter).

Addressing (all kernels): a token at context position ``n`` of sequence ``i`` lives at
``block_tables[i, n // block_size]``, offset ``n % block_size``. Key tiles are gathered per token
through the block table, so the key tile ``BLOCK_N`` is independent of the cache's block size.

Softmax is the online (streaming) form of FlashAttention (Dao et al. 2022, arXiv:2205.14135):
per query row keep the running max ``m``, normaliser ``l`` and unnormalised output ``acc``; for
each key tile ``m' = max(m, max s)``, ``acc = acc * exp(m - m') + exp(s - m') @ V``. Exponentials
are base 2 with ``log2(e)`` folded into the score scale. FP8 scales fold as in ``torch_ref``:
``k_scale`` into the score scale, ``v_scale`` into the final output.

dot precision: fp32 inputs use ``input_precision="ieee"`` (true fp32, matching torch's default of
no TF32 in matmuls, so fp32 engine runs match transformers); bf16/fp16 inputs use the native
16-bit dot with fp32 accumulation, as FlashAttention does.
"""

import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale,
    v_scale,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANT_FP8: tl.constexpr,
):
    # One program per token: all KV heads of that token go to one slot.
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    if QUANT_FP8:
        # Correctly rounded division, as torch's x / scale; e4m3 has no inf, so saturate first.
        k = tl.clamp(tl.div_rn(k.to(tl.float32), k_scale), -448.0, 448.0)  # FP8_MAX
        v = tl.clamp(tl.div_rn(v.to(tl.float32), v_scale), -448.0, 448.0)
    k_dst = k_cache_ptr + blk * stride_kcb + off * stride_kcs + h * stride_kch + d
    v_dst = v_cache_ptr + blk * stride_vcb + off * stride_vcs + h * stride_vch + d
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    score_scale,
    out_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # One program per (decode sequence, KV head): the GROUP query heads sharing that KV head are
    # rows of one tile, so each K/V tile is read once. Decode is memory bound and a one-token
    # query has few rows, so scores are broadcast multiply-and-sum in fp32, not tl.dot.
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_mask = (g < GROUP)[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32) * (score_scale * 1.4426950408889634)  # log2(e): exp2 below

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < seq_len
        blk = tl.load(block_tables_ptr + seq * stride_bt + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        row = (blk * stride_kb + (n % BLOCK_SIZE) * stride_ks)[:, None]
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + row + kv_head * stride_kh + d[None, :], mask=kv_mask, other=0.0)
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [BLOCK_G, BLOCK_N]
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_row = (blk * stride_vb + (n % BLOCK_SIZE) * stride_vs)[:, None]
        v = tl.load(v_cache_ptr + v_row + kv_head * stride_vh + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m_i = m_new
    out = acc * (out_scale / l_i)[:, None]
    o_ptrs = out_ptr + seq * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_ptr,
    score_scale,
    out_scale,
    first_seq,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # One program per (prefill sequence, query head, tile of BLOCK_M new tokens).
    #   context:  | computed before (ctx_len) | new tokens (query_len) |
    #   new token m sits at position ctx_len + m and sees keys 0 .. ctx_len + m.
    seq = (first_seq + tl.program_id(0)).to(tl.int64)
    head = tl.program_id(1)
    m_start = tl.program_id(2) * BLOCK_M
    q_start = tl.load(query_start_ptr + seq)
    query_len = tl.load(query_start_ptr + seq + 1) - q_start
    if m_start >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - query_len
    kv_head = head // GROUP
    m = m_start + tl.arange(0, BLOCK_M)
    q_pos = ctx_len + m
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_mask = (m < query_len)[:, None] & d_ok[None, :]
    q_rows = (q_start + m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + d[None, :], mask=q_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    qk_scale = score_scale * 1.4426950408889634  # log2(e): exp2 below

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Keys past the tile's last query position are masked for every row: stop before them.
    key_end = tl.minimum(seq_len, ctx_len + m_start + BLOCK_M)
    for start in range(0, key_end, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < key_end
        blk = tl.load(block_tables_ptr + seq * stride_bt + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k_row = (blk * stride_kb + (n % BLOCK_SIZE) * stride_ks)[:, None]
        k = tl.load(k_cache_ptr + k_row + kv_head * stride_kh + d[None, :], mask=kv_mask, other=0.0)
        v_row = (blk * stride_vb + (n % BLOCK_SIZE) * stride_vs)[:, None]
        v = tl.load(v_cache_ptr + v_row + kv_head * stride_vh + d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k.to(q.dtype)))
        s = s * qk_scale
        causal = (n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        s = tl.where(causal, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if UPCAST:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc * (out_scale / l_i)[:, None]
    o_ptrs = out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)
