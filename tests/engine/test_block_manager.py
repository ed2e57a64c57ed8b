"""Narrated block-manager scenarios with exact block ids, ref counts and free-queue order.

block_size 4 throughout, so a block holds tokens [4i, 4i+4) of a request.
"""

import pytest

from engine.block_manager import BlockManager, hash_block
from engine.request import Request, SamplingParams


def req(request_id, token_ids, salt=None, computed=None):
    r = Request(request_id, tuple(token_ids), SamplingParams(max_tokens=4), 0.0, cache_salt=salt)
    r.num_computed_tokens = len(token_ids) if computed is None else computed
    return r


def refs(bm, ids):
    return [bm.blocks[i].ref_count for i in ids]


def test_allocation_on_demand_and_all_or_nothing():
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    assert bm.allocate("a", 5)  # 5 tokens -> 2 blocks, taken from the front of the free queue
    assert bm.block_table("a") == (0, 1)
    assert bm.allocate("a", 8)  # 8 tokens still fit in 2 blocks: nothing new
    assert bm.block_table("a") == (0, 1)
    assert bm.allocate("a", 9)  # the 9th token opens block 3 of the table
    assert bm.block_table("a") == (0, 1, 2)
    assert (bm.num_used_blocks, bm.num_free_blocks) == (3, 1)
    # b needs 2 blocks, only 1 is free: nothing changes
    assert not bm.allocate("b", 5)
    assert bm.block_table("b") == () and bm.free_queue() == [3]
    bm.free("a")
    # a's blocks join the free queue tail first: 2, then 1, then 0
    assert bm.free_queue() == [3, 2, 1, 0]
    assert bm.num_used_blocks == 0


def test_prefix_share_free_rehit_and_evict():
    bm = BlockManager(num_blocks=6, block_size=4, enable_prefix_caching=True)
    prompt = list(range(10))  # blocks: [0..3] [4..7] [8,9] (partial)

    # A computes its 10-token prompt: blocks 0, 1, 2. Only the two full blocks get cached.
    a = req("a", prompt)
    assert bm.allocate("a", 10, bm.find_cached_prefix(a))
    bm.cache_computed_blocks(a)
    assert bm.block_table("a") == (0, 1, 2)
    assert [bm.blocks[i].block_hash is not None for i in (0, 1, 2)] == [True, True, False]

    # B shares the first 8 tokens, then differs: hits blocks 0 and 1, gets block 3 for its tail.
    b = req("b", prompt[:8] + [100, 101, 102], computed=0)
    hits = bm.find_cached_prefix(b)
    assert hits == [0, 1]
    assert bm.allocate("b", 11, hits)
    assert bm.block_table("b") == (0, 1, 3)
    assert refs(bm, [0, 1, 2, 3]) == [2, 2, 1, 1]
    assert bm.free_queue() == [4, 5]

    # A finishes: block 2 (ref 0) joins the free queue; 0 and 1 stay, held by B.
    bm.free("a")
    assert refs(bm, [0, 1, 2]) == [1, 1, 0]
    assert bm.free_queue() == [4, 5, 2]
    # B finishes: tail first, so the shared head (block 0) is the last to be reused.
    bm.free("b")
    assert bm.free_queue() == [4, 5, 2, 3, 1, 0]
    assert bm.num_used_blocks == 0

    # C re-hits the cached blocks 0 and 1, which leave the free queue.
    c = req("c", prompt, computed=0)
    assert bm.find_cached_prefix(c) == [0, 1]
    assert bm.allocate("c", 10, [0, 1])
    assert bm.block_table("c") == (0, 1, 4)
    assert bm.free_queue() == [5, 2, 3]
    bm.free("c")
    assert bm.free_queue() == [5, 2, 3, 4, 1, 0]

    # D (other tokens) needs 6 blocks: it takes the whole queue, evicting cached blocks 1 and 0.
    assert bm.num_evictions == 0
    assert bm.allocate("d", 24)
    assert bm.block_table("d") == (5, 2, 3, 4, 1, 0)
    assert bm.num_evictions == 2
    bm.free("d")
    assert bm.find_cached_prefix(req("e", prompt, computed=0)) == []


def test_partial_block_never_cached_and_hit_capped_one_token_short():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = req("a", list(range(8)))  # exactly 2 full blocks
    assert bm.allocate("a", 8)
    bm.cache_computed_blocks(a)
    assert [bm.blocks[i].block_hash is not None for i in (0, 1)] == [True, True]
    # The same 8-token prompt: a hit on both blocks would leave no token to compute, so the
    # lookup stops at (8 - 1) // 4 = 1 block.
    assert bm.find_cached_prefix(req("b", list(range(8)), computed=0)) == [0]
    # 9 tokens: (9 - 1) // 4 = 2 blocks may be hit.
    assert bm.find_cached_prefix(req("c", list(range(9)), computed=0)) == [0, 1]
    # A request that computed only 6 of its tokens caches just its first block.
    e = req("e", list(range(20, 30)), computed=6)
    assert bm.allocate("e", 6)
    bm.cache_computed_blocks(e)
    assert [bm.blocks[i].block_hash is not None for i in bm.block_table("e")] == [True, False]


def test_cache_salt_separates_tenants():
    bm = BlockManager(num_blocks=8, block_size=4)
    text = list(range(9))
    a = req("a", text, salt="tenant-1")
    assert bm.allocate("a", 9)
    bm.cache_computed_blocks(a)
    assert bm.find_cached_prefix(req("b", text, salt="tenant-2", computed=0)) == []
    assert bm.find_cached_prefix(req("c", text, salt=None, computed=0)) == []
    assert bm.find_cached_prefix(req("d", text, salt="tenant-1", computed=0)) == [0, 1]


def test_hash_chain_depends_on_parent_and_salt():
    h0 = hash_block(None, [1, 2, 3, 4], None)
    assert hash_block(None, [1, 2, 3, 4], None) == h0
    assert hash_block(None, [1, 2, 3, 5], None) != h0
    assert hash_block(None, [1, 2, 3, 4], "s") != h0
    assert hash_block(h0, [5, 6, 7, 8], None) != hash_block(None, [5, 6, 7, 8], None)


def test_blocks_cached_a_few_at_a_time_carry_the_chain_of_hash_block():
    """A salted request of 6 prompt tokens decoding 9 more (outputs 100..108), its full blocks
    offered to the cache after 5, 9 and 14 computed tokens (one block, one more, then two at
    once, some of them output tokens): each cached block holds hash_block chained over the blocks
    before it, the first with the salt."""
    bm = BlockManager(num_blocks=8, block_size=4)
    a = req("a", range(6), salt="t", computed=0)
    a.output_token_ids.extend(range(100, 109))
    tokens = [*range(6), *range(100, 109)]
    for computed in (5, 9, 14):
        a.num_computed_tokens = computed
        assert bm.allocate("a", computed)
        bm.cache_computed_blocks(a)
    chain, parent = [], None
    for i in range(3):
        parent = hash_block(parent, tokens[4 * i : 4 * i + 4], "t" if i == 0 else None)
        chain.append(parent)
    assert [bm.blocks[b].block_hash for b in bm.block_table("a")] == chain + [None]


def test_duplicate_content_is_not_cached_twice():
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = req("a", list(range(5))), req("b", list(range(5)))
    assert bm.allocate("a", 5) and bm.allocate("b", 5)  # both computed in the same step
    bm.cache_computed_blocks(a)
    bm.cache_computed_blocks(b)
    assert bm.blocks[0].block_hash is not None and bm.blocks[2].block_hash is None
    assert bm.find_cached_prefix(req("c", list(range(5)), computed=0)) == [0]


def test_bad_sizes():
    with pytest.raises(ValueError):
        BlockManager(num_blocks=0, block_size=4)


def test_append_blocks_gives_what_allocate_would_one_request_after_another():
    mine = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    theirs = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    for bm in (mine, theirs):
        assert bm.allocate("a", 4) and bm.allocate("b", 8) and bm.allocate("c", 4)  # blocks 0 | 1 2 | 3
        bm.free("b")  # free queue: 4 5 6 7 (never used), then 2, 1
    assert mine.append_blocks(["c", "a"])
    assert theirs.allocate("c", 5) and theirs.allocate("a", 5)
    assert mine.block_table("a") == theirs.block_table("a") == (0, 5)
    assert mine.block_table("c") == theirs.block_table("c") == (3, 4)
    assert mine.free_queue() == theirs.free_queue()
    # all or nothing: 4 free blocks (6, 7, 2, 1) cannot give 5 requests one each
    assert not mine.append_blocks(["a", "c", "a", "c", "a"])
    assert mine.block_table("a") == (0, 5) and mine.num_free_blocks == 4


def test_uncached_hashes_and_hashes_evicted_by():
    """A pool of 4: "a" holds 9 computed tokens in blocks 0, 1, 2; its two full blocks hash as
    hash_block chains them, none offered yet. Once offered and freed (tail first: free queue
    3 | 2 1 0, block 3 never used), taking 1 block evicts nothing, 2 evict nothing (block 2 is
    partial, uncached), 3 evict block 1's hash, 4 both; asking changes nothing."""
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=True)
    a = req("a", range(9))
    assert bm.allocate("a", 9)
    h0 = hash_block(None, [0, 1, 2, 3], None)
    h1 = hash_block(h0, [4, 5, 6, 7], None)
    assert bm.uncached_hashes(a) == [h0, h1]
    bm.cache_computed_blocks(a)
    assert bm.uncached_hashes(a) == []
    bm.free("a")
    assert bm.free_queue() == [3, 2, 1, 0]
    assert [bm.hashes_evicted_by(n) for n in (1, 2, 3, 4)] == [set(), set(), {h1}, {h0, h1}]
    assert bm.free_queue() == [3, 2, 1, 0] and bm.num_evictions == 0
