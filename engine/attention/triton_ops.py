"""Triton paged attention: cache write, decode, and (chunked) prefill kernels with checked wrappers.

The default backend on CUDA. On CPU it runs only in Triton's interpreter (``TRITON_INTERPRET=1``),
whose dtype faults shape the wrappers (CONTRIBUTING.md, "Triton on a CPU"): bf16/fp8 arithmetic and
fp32 -> bf16/fp8 casts are wrong there, loads followed by an fp32 upcast are exact. So under the
interpreter every kernel computes in fp32, the write kernel copies values that torch quantised on
the host (as same-width integers), and outputs are written in fp32 and cast by torch. On a GPU
the kernels cast natively (fp8 quantisation in the write kernel, 16-bit outputs) and the prefill
kernel's 16-bit dots use tensor cores. The decode kernel computes in fp32 on both.

The kernels and their algorithm: engine.attention.triton_kernels.
"""

from __future__ import annotations

import os

import torch
import triton

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_ref import FP8_DTYPE, quantize_to_cache
from engine.attention.triton_kernels import _decode_kernel, _prefill_kernel, _write_kv_kernel

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, FP8_DTYPE)
MODEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise ValueError(f"triton attention: {problem}")


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    _require(
        k_cache.dim() == 4 and k_cache.shape == v_cache.shape,
        "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim] "
        f"(got {tuple(k_cache.shape)} and {tuple(v_cache.shape)})",
    )
    _require(
        k_cache.dtype == v_cache.dtype and k_cache.dtype in CACHE_DTYPES,
        f"cache dtype must be one of {CACHE_DTYPES} and equal for K and V (got {k_cache.dtype} and {v_cache.dtype})",
    )
    _require(
        k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1,
        f"caches need a contiguous head_dim (got strides {k_cache.stride()} and {v_cache.stride()})",
    )
    _require(k_cache.device == v_cache.device, "k_cache and v_cache must be on one device")
    if k_cache.device.type != "cuda" and not _interpreting():
        raise RuntimeError(
            "triton attention on CPU needs the Triton interpreter: set TRITON_INTERPRET=1 before "
            "triton is imported (or use attention_backend torch)"
        )


def _check_tokens(x: torch.Tensor, name: str, k_cache: torch.Tensor, num_heads: int | None = None) -> None:
    """x: [num_tokens, num_heads (any if None), head_dim], on the cache's device, head_dim contiguous."""
    head_dim = k_cache.shape[3]
    _require(
        x.dim() == 3 and x.shape[2] == head_dim and num_heads in (None, x.shape[1]),
        f"{name} must be [num_tokens, {num_heads or 'num_heads'}, {head_dim}] (got {tuple(x.shape)})",
    )
    _require(x.dtype in MODEL_DTYPES, f"{name} dtype must be one of {MODEL_DTYPES} (got {x.dtype})")
    _require(x.stride(-1) == 1, f"{name} needs a contiguous head_dim (got strides {x.stride()})")
    _require(x.device == k_cache.device, f"{name} is on {x.device}, the cache on {k_cache.device}")


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store this step's K/V in the paged cache, in place (contract: ``engine.attention``).

    key, value: [num_tokens, num_kv_heads, head_dim]. k_cache, v_cache:
    [num_blocks, block_size, num_kv_heads, head_dim]. slot_mapping: [num_tokens] int64.
    fp8 cache: stores ``fp8(clamp(x / scale, +-448))``, the same bytes as ``torch_ref``.

    Raises:
        ValueError: one line naming the tensor whose shape, dtype, stride or device is wrong.
        RuntimeError: on CPU without ``TRITON_INTERPRET=1``.
    """
    _check_cache(k_cache, v_cache)
    _check_tokens(key, "key", k_cache, k_cache.shape[2])
    _check_tokens(value, "value", k_cache, k_cache.shape[2])
    num_tokens = key.shape[0]
    _require(
        slot_mapping.dtype == torch.int64 and slot_mapping.shape == (num_tokens,),
        f"slot_mapping must be [{num_tokens}] int64 (got {tuple(slot_mapping.shape)} {slot_mapping.dtype})",
    )
    _require(value.shape[0] == num_tokens, f"value has {value.shape[0]} tokens, key {num_tokens}")
    if num_tokens == 0:
        return
    slot_mapping = slot_mapping.contiguous()
    quant_fp8 = k_cache.dtype == FP8_DTYPE
    if _interpreting():
        # The interpreter's fp8/bf16 casts are wrong: quantise with torch, copy as integers.
        int_dtype = _SAME_WIDTH_INT[k_cache.element_size()]
        key = quantize_to_cache(key, k_cache.dtype, k_scale).view(int_dtype)
        value = quantize_to_cache(value, v_cache.dtype, v_scale).view(int_dtype)
        k_cache, v_cache = k_cache.view(int_dtype), v_cache.view(int_dtype)
        quant_fp8 = False
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        float(k_scale),
        float(v_scale),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        QUANT_FP8=quant_fp8,
    )


def _check_meta(meta: AttentionMetadata, device: torch.device) -> None:
    n = meta.num_seqs
    for name, t, shape in (
        ("seq_lens", meta.seq_lens, (n,)),
        ("query_start_loc", meta.query_start_loc, (n + 1,)),
    ):
        _require(
            t.dtype == torch.int32 and tuple(t.shape) == shape and t.is_contiguous(),
            f"meta.{name} must be contiguous {list(shape)} int32 (got {tuple(t.shape)} {t.dtype})",
        )
    bt = meta.block_tables
    _require(
        bt.dtype == torch.int32 and bt.dim() == 2 and bt.shape[0] == n and bt.stride(1) == 1,
        f"meta.block_tables must be [{n}, max_num_blocks] int32, rows contiguous "
        f"(got {tuple(bt.shape)} {bt.dtype} strides {bt.stride()})",
    )
    _require(0 <= meta.num_decodes <= n, f"meta.num_decodes must be in 0..{n} (got {meta.num_decodes})")
    for name in ("seq_lens", "query_start_loc", "block_tables"):
        where = getattr(meta, name).device
        _require(where == device, f"meta.{name} is on {where}, the query on {device}")


def _decode_block_n(block_g: int, block_d: int, interpreting: bool) -> int:
    """Key tile of the decode kernel. The [BLOCK_G, BLOCK_N, BLOCK_D] fp32 product lives in
    registers; capped at 4096 values it compiled for sm_90 (ptxas -v, 4 warps) without spills for
    groups 1-8, head_dim 64 and 128, bf16, fp32 and fp8 caches. The interpreter pays per loop
    iteration, not per register: there the tile is long."""
    if interpreting:
        return 128
    return max(16, min(64, 4096 // (block_g * block_d)))


def _prefill_tiles(block_d: int, interpreting: bool) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the prefill kernel. 64 x 32 with 8 warps compiled for sm_90 without
    spills for head_dim 64 and 128 in bf16, fp8 and fp32 (64 x 64 spilled in fp32); larger heads
    take smaller tiles (not compiled here)."""
    if interpreting:
        return 64, 128
    return (64, 32) if block_d <= 128 else (32, 16)


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged context (contract:
    ``engine.attention``): query [num_tokens, num_heads, head_dim] -> same shape, query's dtype.

    Decodes (the first ``meta.num_decodes`` sequences) run one program per (sequence, KV head);
    prefills and chunks one per (sequence, head, ``block_m`` new tokens). ``block_m`` (prefill
    query tile) and ``block_n`` (key tile, both kernels) are powers of two >= 16 (``tl.dot``'s
    minimum); None picks a default for the device. Tests pass small tiles so that tiny shapes
    still cover several tiles.

    Raises:
        ValueError: one line naming the tensor or field whose shape, dtype, stride or device is wrong.
        RuntimeError: on CPU without ``TRITON_INTERPRET=1``.
    """
    _check_cache(k_cache, v_cache)
    _check_tokens(query, "query", k_cache)
    _check_meta(meta, query.device)
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    _require(
        num_heads % num_kv_heads == 0,
        f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})",
    )
    for name, tile in (("block_m", block_m), ("block_n", block_n)):
        _require(
            tile is None or (tile >= 16 and tile & (tile - 1) == 0),
            f"{name} must be a power of two >= 16 (got {tile})",
        )
    interpreting = _interpreting()
    is_fp8 = k_cache.dtype == FP8_DTYPE
    score_scale = float(scale) * (float(k_scale) if is_fp8 else 1.0)
    out_scale = float(v_scale) if is_fp8 else 1.0
    # The interpreter's fp32 -> 16-bit casts truncate: write fp32 there and let torch round.
    out = torch.empty(query.shape, dtype=torch.float32 if interpreting else query.dtype, device=query.device)
    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    common = (
        out.stride(0),
        out.stride(1),
        meta.block_tables.stride(0),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
    )
    nd = meta.num_decodes
    if nd > 0:
        block_g = triton.next_power_of_2(group)
        _decode_kernel[(nd, num_kv_heads)](
            query,
            k_cache,
            v_cache,
            out,
            meta.block_tables,
            meta.seq_lens,
            score_scale,
            out_scale,
            query.stride(0),
            query.stride(1),
            *common,
            GROUP=group,
            HEAD_DIM=head_dim,
            BLOCK_SIZE=block_size,
            BLOCK_G=block_g,
            BLOCK_D=block_d,
            BLOCK_N=block_n or _decode_block_n(block_g, block_d, interpreting),
            num_warps=4,
        )
    num_prefills = meta.num_seqs - nd
    if num_prefills > 0:
        default_m, default_n = _prefill_tiles(block_d, interpreting)
        tile_m = block_m or default_m
        _prefill_kernel[(num_prefills, num_heads, triton.cdiv(meta.max_query_len, tile_m))](
            query,
            k_cache,
            v_cache,
            out,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            score_scale,
            out_scale,
            nd,
            query.stride(0),
            query.stride(1),
            *common,
            GROUP=group,
            HEAD_DIM=head_dim,
            BLOCK_SIZE=block_size,
            BLOCK_M=tile_m,
            BLOCK_D=block_d,
            BLOCK_N=block_n or default_n,
            UPCAST=interpreting or query.dtype == torch.float32,
            num_warps=8,
        )
    return out if out.dtype == query.dtype else out.to(query.dtype)
