"""Triton kernels (under TRITON_INTERPRET=1 here) against torch_ref and the dense fp64 reference.

Shapes stay tiny: the interpreter costs ~3 ms per loop iteration per program. Small tiles
(block_m = block_n = 16) make each case still span several key tiles and query tiles.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.attention import torch_ref, triton_ops
from tests.engine.attn_cases import FP8, MIXED, dense_attention, fill_cache, make_case, rel_err

pytestmark = pytest.mark.triton
TILES = dict(block_m=16, block_n=16)


def _triton_fill(case, k_scale=1.0, v_scale=1.0):
    """Return (k_cache, v_cache) written by the Triton kernel from the case's untouched junk cache."""
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    triton_ops.write_kv_cache(
        torch.cat(case.keys), torch.cat(case.values), k_cache, v_cache, case.context_slots, k_scale, v_scale
    )
    return k_cache, v_cache


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.float16, FP8])
def test_write_stores_the_same_bytes_as_torch_ref_and_leaves_other_slots(cache_dtype):
    case = make_case(MIXED, block_size=4, num_heads=4, num_kv_heads=2, head_dim=16, cache_dtype=cache_dtype)
    before = case.k_cache.clone()
    k_cache, v_cache = _triton_fill(case, 0.02, 0.05)
    fill_cache(torch_ref, case, 0.02, 0.05)
    as_int = {4: torch.int32, 2: torch.int16, 1: torch.int8}[case.k_cache.element_size()]
    assert torch.equal(k_cache.view(as_int), case.k_cache.view(as_int))
    assert torch.equal(v_cache.view(as_int), case.v_cache.view(as_int))
    # The junk in slots that no token maps to is still there (spare blocks, partial last blocks).
    unwritten = torch.ones(k_cache.shape[:2], dtype=torch.bool)
    unwritten.view(-1)[case.context_slots] = False
    assert unwritten.sum() > 0
    assert torch.equal(k_cache[unwritten].view(as_int), before[unwritten].view(as_int))


def test_write_with_strided_key_from_a_fused_qkv_projection():
    # K and V as column slices of one [num_tokens, (2 * kv_heads) * d] tensor: token stride 2 * 2 * 8.
    case = make_case([(0, 6)], block_size=4, num_heads=2, num_kv_heads=2, head_dim=8)
    kv = torch.cat([case.keys[0], case.values[0]], dim=1)  # [6, 4, 8]
    key, value = kv[:, :2], kv[:, 2:]
    assert not key.is_contiguous()
    k_cache, v_cache = torch.zeros_like(case.k_cache), torch.zeros_like(case.v_cache)
    triton_ops.write_kv_cache(key, value, k_cache, v_cache, case.context_slots)
    table = case.meta.block_tables[0]
    assert torch.equal(k_cache[table[1], 1], case.keys[0][5])
    assert torch.equal(v_cache[table[0], 2], case.values[0][2])


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim,block_size",
    [(4, 4, 16, 4), (6, 2, 16, 4), (9, 3, 16, 8), (4, 1, 32, 16), (4, 2, 24, 4)],
)
def test_mixed_batch_matches_torch_ref_fp32(num_heads, num_kv_heads, head_dim, block_size):
    case = make_case(MIXED, block_size, num_heads, num_kv_heads, head_dim, seed=head_dim + block_size)
    fill_cache(torch_ref, case)
    scale = head_dim**-0.5
    ref = torch_ref.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, scale)
    out = triton_ops.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, scale, **TILES)
    assert out.dtype == torch.float32
    assert rel_err(out, ref) <= 1e-3
    assert rel_err(out, dense_attention(case, scale)) <= 1e-5  # fp32 all the way: far tighter


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_ragged_batches_with_long_chunks_match_torch_ref(seed):
    # Query tiles: a 37-token whole prefill spans 3 tiles of 16, a 20-token chunk 2 of them.
    g = torch.Generator().manual_seed(seed)
    decodes = [(int(n), 1) for n in torch.randint(1, 60, (3,), generator=g)]
    prefills = [(0, 37), (int(torch.randint(1, 30, (1,), generator=g)), 20), (40, 3)]
    case = make_case(decodes + prefills, block_size=8, num_heads=6, num_kv_heads=2, head_dim=16, seed=seed)
    fill_cache(torch_ref, case)
    ref = torch_ref.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, 0.25)
    out = triton_ops.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, 0.25, **TILES)
    assert rel_err(out, ref) <= 1e-3


def test_default_tiles_give_the_same_result():
    case = make_case(MIXED, block_size=4, num_heads=4, num_kv_heads=2, head_dim=16, seed=9)
    fill_cache(torch_ref, case)
    small = triton_ops.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, 0.25, **TILES)
    default = triton_ops.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, 0.25)
    assert rel_err(default, small) <= 1e-5


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16])
def test_bf16_cache_reads_correctly(model_dtype):
    case = make_case(MIXED, block_size=4, num_heads=6, num_kv_heads=3, head_dim=16, cache_dtype=torch.bfloat16)
    fill_cache(torch_ref, case)
    query = case.query.to(model_dtype)
    out = triton_ops.paged_attention(query, case.k_cache, case.v_cache, case.meta, 0.25, **TILES)
    ref = torch_ref.paged_attention(query, case.k_cache, case.v_cache, case.meta, 0.25)
    assert out.dtype == model_dtype
    if model_dtype == torch.float32:
        assert rel_err(out, ref) <= 1e-3
        assert rel_err(out, dense_attention(case, 0.25, torch.bfloat16)) <= 1e-5
    else:
        # Both round the output to bf16 (8 significant bits); torch_ref also computes in bf16.
        assert rel_err(out, ref) <= 1e-2
        assert rel_err(out, dense_attention(case, 0.25, torch.bfloat16)) <= 1e-2


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_written_and_read_like_torch_ref(model_dtype):
    case = make_case(MIXED, block_size=4, num_heads=6, num_kv_heads=2, head_dim=16, cache_dtype=FP8)
    k_scale, v_scale = 0.02, 0.01  # large |x| saturate at 448 * scale
    k_cache, v_cache = _triton_fill(case, k_scale, v_scale)
    fill_cache(torch_ref, case, k_scale, v_scale)
    assert torch.equal(k_cache.view(torch.uint8), case.k_cache.view(torch.uint8))
    query = case.query.to(model_dtype)
    out = triton_ops.paged_attention(query, k_cache, v_cache, case.meta, 0.25, k_scale, v_scale, **TILES)
    ref = torch_ref.paged_attention(query, case.k_cache, case.v_cache, case.meta, 0.25, k_scale, v_scale)
    dense = dense_attention(case, 0.25, FP8, k_scale, v_scale)
    if model_dtype == torch.float32:
        assert rel_err(out, ref) <= 1e-3 and rel_err(out, dense) <= 1e-5
    else:
        assert rel_err(out, ref) <= 1e-2 and rel_err(out, dense) <= 1e-2


def test_bad_inputs_raise_one_line_naming_the_tensor(monkeypatch):
    case = make_case([(3, 1), (0, 4)], block_size=4, num_heads=4, num_kv_heads=2, head_dim=16)
    q, kc, vc = case.query, case.k_cache, case.v_cache
    bad_tables = dataclasses.replace(case.meta, block_tables=case.meta.block_tables.long())
    with pytest.raises(ValueError, match=r"meta.block_tables must be \[2, max_num_blocks\] int32"):
        triton_ops.paged_attention(q, kc, vc, bad_tables, 0.25)
    with pytest.raises(ValueError, match=r"query must be \[num_tokens, num_heads, 16\] \(got \(5, 4, 8\)\)"):
        triton_ops.paged_attention(q[..., :8], kc, vc, case.meta, 0.25)
    with pytest.raises(ValueError, match="query needs a contiguous head_dim"):
        triton_ops.paged_attention(q.transpose(1, 2).contiguous().transpose(1, 2), kc, vc, case.meta, 0.25)
    with pytest.raises(ValueError, match=r"num_heads \(3\) must be a multiple of num_kv_heads \(2\)"):
        triton_ops.paged_attention(q[:, :3], kc, vc, case.meta, 0.25)
    with pytest.raises(ValueError, match="block_n must be a power of two >= 16"):
        triton_ops.paged_attention(q, kc, vc, case.meta, 0.25, block_n=8)
    with pytest.raises(ValueError, match=r"slot_mapping must be \[5\] int64"):
        triton_ops.write_kv_cache(q[:, :2], q[:, :2], kc, vc, case.context_slots.int())
    with pytest.raises(ValueError, match="cache dtype must be one of"):
        triton_ops.write_kv_cache(q[:, :2], q[:, :2], kc.double(), vc.double(), case.context_slots[:5])
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1"):
        triton_ops.paged_attention(q, kc, vc, case.meta, 0.25)


# Compiles each kernel for an H100/H200 (sm_90) with the tiles the wrappers pick there, in a fresh
# process without the interpreter (it patches triton.language in this one). No GPU is needed:
# ptxas ships in the triton wheel. This checks the native-cast branches the interpreter never runs
# (fp8 quantisation in-kernel, 16-bit tensor-core dots); it does not check their numbers.
_COMPILE_FOR_SM90 = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.attention import triton_ops as T

def compile_(kernel, types, consts, num_warps):
    sig = {n: types.get(n, "i32") for n in kernel.arg_names}
    sig.update({c: "constexpr" for c in consts})
    k = triton.compile(ASTSource(kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=num_warps))
    assert k.asm["cubin"], kernel

for model, cache in (("bf16", "bf16"), ("fp32", "fp32"), ("bf16", "fp8e4nv"), ("fp16", "fp32")):
    group, head_dim, block_g = 3, 64, 4  # SmolLM2-135M: 9 heads over 3 KV heads
    compile_(T._write_kv_kernel,
             dict(key_ptr="*" + model, value_ptr="*" + model, k_cache_ptr="*" + cache,
                  v_cache_ptr="*" + cache, slot_ptr="*i64", k_scale="fp32", v_scale="fp32"),
             dict(NUM_KV_HEADS=3, HEAD_DIM=head_dim, BLOCK_SIZE=16, BLOCK_H=4, BLOCK_D=64,
                  QUANT_FP8=cache == "fp8e4nv"), 4)
    attn = dict(q_ptr="*" + model, out_ptr="*" + model, k_cache_ptr="*" + cache,
                v_cache_ptr="*" + cache, block_tables_ptr="*i32", seq_lens_ptr="*i32",
                query_start_ptr="*i32", score_scale="fp32", out_scale="fp32")
    compile_(T._decode_kernel, attn,
             dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=16, BLOCK_G=block_g, BLOCK_D=64,
                  BLOCK_N=T._decode_block_n(block_g, 64, False)), 4)
    block_m, block_n = T._prefill_tiles(64, False)
    compile_(T._prefill_kernel, attn,
             dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=16, BLOCK_M=block_m, BLOCK_D=64,
                  BLOCK_N=block_n, UPCAST=model == "fp32"), 8)
print("compiled")
"""


def test_kernels_compile_natively_for_sm90():
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("this triton wheel ships no ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(Path(os.environ.get("TMPDIR", "/tmp")) / "kvplan-triton-sm90-cache")
    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE_FOR_SM90], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
