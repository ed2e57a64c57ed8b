"""torch_ref paged attention against plain causal softmax attention over contiguous K/V (fp64)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.attention import AttentionMetadata, torch_ref
from tests.engine.attn_cases import FP8, MIXED, dense_attention, fill_cache, make_case, rel_err


def test_write_puts_each_token_where_its_block_table_says():
    # block_size 4, seq 0 has 6 tokens in blocks [b0, b1] -> token 5 sits in b1 at offset 1.
    case = make_case([(5, 1), (0, 3)], block_size=4, num_heads=2, num_kv_heads=2, head_dim=8)
    untouched = case.k_cache.clone()
    fill_cache(torch_ref, case)
    table = case.meta.block_tables[0].tolist()
    assert torch.equal(case.k_cache[table[1], 1], case.keys[0][5])
    assert torch.equal(case.v_cache[table[0], 3], case.values[0][3])
    written = torch.zeros(case.k_cache.shape[:2], dtype=torch.bool)
    for i, n in enumerate(case.meta.seq_lens.tolist()):
        for pos in range(n):
            blk = case.meta.block_tables[i, pos // 4]
            assert torch.equal(case.k_cache[blk, pos % 4], case.keys[i][pos])
            written[blk, pos % 4] = True
    assert written.sum() == 6 + 3
    # Slots no token maps to (partial last blocks, spare blocks) keep their old contents.
    assert torch.equal(case.k_cache[~written], untouched[~written])


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_write_casts_to_a_16_bit_cache_with_round_to_nearest(cache_dtype):
    case = make_case([(0, 7)], block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, cache_dtype=cache_dtype)
    fill_cache(torch_ref, case)
    flat = case.k_cache.view(-1, 1, 8)[case.context_slots]
    assert flat.dtype == cache_dtype
    assert torch.equal(flat, case.keys[0].to(cache_dtype))


def test_fp8_write_stores_x_over_scale_and_saturates_at_448():
    k_cache = torch.zeros(2, 4, 1, 4, dtype=FP8)
    v_cache = torch.zeros(2, 4, 1, 4, dtype=FP8)
    key = torch.tensor([[[1.0, -3.0, 1000.0, -5000.0]]])  # scale 2: 0.5, -1.5, 500 -> 448, -2500 -> -448
    value = torch.tensor([[[0.25, 0.3, 0.0, -0.1]]])
    torch_ref.write_kv_cache(key, value, k_cache, v_cache, torch.tensor([6]), k_scale=2.0, v_scale=0.5)
    assert k_cache[1, 2, 0].float().tolist() == [0.5, -1.5, 448.0, -448.0]
    # 0.6 is not an e4m3 value: nearest are 0.5625 and 0.625 (3 mantissa bits: steps of 1/16 in [0.5, 1)).
    assert v_cache[1, 2, 0].float().tolist() == [0.5, 0.625, 0.0, -0.203125]
    assert k_cache[0].float().abs().sum() == 0 and k_cache[1, 3].float().abs().sum() == 0


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (9, 3), (4, 1)])
def test_mixed_decode_and_chunked_prefill_matches_dense_fp32(num_heads, num_kv_heads):
    case = make_case(MIXED, block_size=4, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=16)
    fill_cache(torch_ref, case)
    scale = 1 / math.sqrt(16)
    out = torch_ref.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, scale)
    assert out.shape == case.query.shape and out.dtype == torch.float32
    assert rel_err(out, dense_attention(case, scale)) < 1e-5


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_16_bit_cache_and_model_match_dense_over_the_rounded_kv(cache_dtype):
    case = make_case(MIXED, block_size=8, num_heads=6, num_kv_heads=2, head_dim=32, cache_dtype=cache_dtype)
    fill_cache(torch_ref, case)
    scale = 1 / math.sqrt(32)
    query = case.query.to(cache_dtype)
    out = torch_ref.paged_attention(query, case.k_cache, case.v_cache, case.meta, scale)
    assert out.dtype == cache_dtype
    ref = dense_attention(case, scale, cache_dtype)
    # The query and the output are rounded to 8 (bf16) or 11 (fp16) significant bits.
    assert rel_err(out, ref) < (2e-2 if cache_dtype == torch.bfloat16 else 3e-3)


def test_fp32_model_reading_a_bf16_cache():
    case = make_case(MIXED, block_size=4, num_heads=4, num_kv_heads=2, head_dim=16, cache_dtype=torch.bfloat16)
    fill_cache(torch_ref, case)
    out = torch_ref.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, 0.25)
    assert out.dtype == torch.float32
    assert rel_err(out, dense_attention(case, 0.25, torch.bfloat16)) < 1e-5


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_matches_dense_over_the_dequantised_kv(model_dtype):
    case = make_case(MIXED, block_size=4, num_heads=6, num_kv_heads=3, head_dim=16, cache_dtype=FP8)
    k_scale, v_scale = 0.02, 0.01  # |x| up to ~4.5 -> up to ~225 and ~450: the V tail saturates
    fill_cache(torch_ref, case, k_scale, v_scale)
    query = case.query.to(model_dtype)
    out = torch_ref.paged_attention(query, case.k_cache, case.v_cache, case.meta, 0.25, k_scale, v_scale)
    ref = dense_attention(case, 0.25, FP8, k_scale, v_scale)
    assert rel_err(out, ref) < (1e-5 if model_dtype == torch.float32 else 2e-2)
    # The fp8 error itself is visible: against unquantised K/V the output is clearly off.
    assert rel_err(out.float(), dense_attention(case, 0.25)) > 1e-3


@pytest.mark.parametrize("merge_max_padding,num_groups", [(0, 3), (8 * 25, 2), (10**6, 1)])
def test_decodes_sorted_into_groups_come_back_in_batch_order(monkeypatch, merge_max_padding, num_groups):
    # 19 decodes of shuffled lengths ahead of two prefills. Sorted, in groups of 8:
    #   [1 2 3 4 5 6 7 9] [11 12 16 17 20 23 28 30] [38 44 51]
    # merging group 2 into group 1 pads 8 rows by 30 - 9 = 21 (168 positions); group 3 into
    # groups 1+2 pads 16 rows by 51 - 30 = 21 (336 positions).
    monkeypatch.setattr(torch_ref, "MERGE_MAX_PADDING", merge_max_padding)
    lens = [30, 2, 17, 5, 44, 9, 1, 23, 12, 38, 7, 3, 51, 16, 4, 28, 11, 6, 20]
    case = make_case([(n, 1) for n in lens] + [(0, 7), (5, 6)], 4, 6, 2, 16, seed=5)
    fill_cache(torch_ref, case)
    out = torch_ref.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, 0.25)
    assert rel_err(out, dense_attention(case, 0.25)) < 1e-5
    plan = torch_ref._decode_plan(case.meta, 4)
    assert [(g.n, g.max_len) for g in plan.groups][-1] == ((19, 52) if num_groups == 1 else (3, 52))
    assert len(plan.groups) == num_groups


def test_layers_sharing_one_metadata_object_each_read_their_own_cache():
    # The decode grouping is built once per metadata object; a second layer must still read its
    # own cache, and a new metadata object must not reuse the old grouping.
    case = make_case([(n, 1) for n in (9, 30, 2, 17, 5, 40, 11, 3, 26, 8)] + [(4, 6)], 4, 4, 2, 16)
    layer2 = dataclasses.replace(
        case,
        keys=[k.flip(-1) for k in case.keys],
        values=[-v for v in case.values],
        k_cache=case.k_cache.clone(),
        v_cache=case.v_cache.clone(),
    )
    for c in (case, layer2):
        fill_cache(torch_ref, c)
    for c in (case, layer2, case):
        out = torch_ref.paged_attention(c.query, c.k_cache, c.v_cache, c.meta, 0.25)
        assert rel_err(out, dense_attention(c, 0.25)) < 1e-5
    shorter = make_case([(n, 1) for n in (3, 1, 6, 2, 8, 4, 7, 5, 2)], 4, 4, 2, 16, seed=1)
    fill_cache(torch_ref, shorter)
    out = torch_ref.paged_attention(shorter.query, shorter.k_cache, shorter.v_cache, shorter.meta, 0.25)
    assert rel_err(out, dense_attention(shorter, 0.25)) < 1e-5


def test_decodes_only_and_prefills_only_batches():
    scale = 0.25
    for seqs in ([(3, 1), (20, 1), (7, 1)], [(0, 9), (4, 4)]):
        case = make_case(seqs, block_size=4, num_heads=4, num_kv_heads=2, head_dim=16, seed=3)
        fill_cache(torch_ref, case)
        out = torch_ref.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, scale)
        assert rel_err(out, dense_attention(case, scale)) < 1e-5


def test_first_token_sees_only_itself():
    # A 1-token prompt: softmax over one key is 1, so the output is exactly that token's value.
    k_cache = torch.zeros(2, 4, 1, 4)
    v_cache = torch.zeros(2, 4, 1, 4)
    key, value = torch.randn(1, 1, 4), torch.randn(1, 1, 4)
    slots = torch.tensor([4])  # block 1, offset 0
    torch_ref.write_kv_cache(key, value, k_cache, v_cache, slots)
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        seq_lens=torch.tensor([1], dtype=torch.int32),
        block_tables=torch.tensor([[1]], dtype=torch.int32),
        num_decodes=0,
        max_query_len=1,
        max_seq_len=1,
    )
    out = torch_ref.paged_attention(torch.randn(1, 2, 4), k_cache, v_cache, meta, 0.5)
    assert torch.allclose(out, value.expand(1, 2, 4))


@settings(max_examples=25, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=6),
    num_decodes=st.integers(0, 4),
    block_size=st.sampled_from([1, 2, 4, 16]),
    heads=st.sampled_from([(2, 1), (4, 2), (3, 3), (8, 2)]),
    seed=st.integers(0, 1000),
)
def test_random_batches_match_dense(seqs, num_decodes, block_size, heads, seed):
    # Leading 1-token sequences with context are decodes; a whole prefill closes that run, and any
    # later (context, 1) entry is a 1-token prefill chunk.
    decodes = [(c + 1, 1) for c in range(num_decodes)]
    seqs = decodes + [(0, 1 + seed % 12)] + seqs
    case = make_case(seqs, block_size, heads[0], heads[1], head_dim=8, seed=seed)
    fill_cache(torch_ref, case)
    out = torch_ref.paged_attention(case.query, case.k_cache, case.v_cache, case.meta, 0.3)
    assert case.meta.num_decodes == num_decodes
    assert rel_err(out, dense_attention(case, 0.3)) < 1e-5
