"""A decode run's blocks settled after it (engine.decode_run): the blocks its steps take and the
blocks they fill, offered to the prefix cache, left in the block manager as the steps one by one
would have left them."""

from __future__ import annotations

from engine.block_manager import BlockManager
from engine.request import Request


def settle(
    bm: BlockManager,
    running: list[Request],
    computed: list[int],
    taken: tuple[list[int], list[str]],
    fills: list[int],
    k: int,
) -> None:
    """Take the run's blocks and offer its filled blocks to the prefix cache, leaving the block
    manager as the run's ``k`` steps would have, each taking its blocks (``taken``: the step of
    each block and its request, in the order the steps take them) and then offering the blocks it
    filled (request i's at steps ``fills[i] + m x block_size``; [] without prefix caching). Taking
    blocks never touches a filled block's cache entry unless it evicts a cached block of the same
    hash, so where none of the evicted hashes is a filled block's, all blocks are taken first
    (one call) and the filled blocks offered after (``_cache_filled``); else step by step, in the
    steps' order."""
    which = [i for i, f in enumerate(fills) if f < k]
    evicted = bm.hashes_evicted_by(len(taken[1])) if which else set()
    # a first block hashed in the run may settle deferred blocks the takes evict (engine.deferred_hashes)
    unhashed = bm.deferring and any(not bm.num_hashed(running[i]) for i in which)
    if evicted and (unhashed or not all(evicted.isdisjoint(bm.uncached_hashes(running[i])) for i in which)):
        grows: dict[int, list[str]] = {}
        for j, rid in zip(*taken):
            grows.setdefault(j, []).append(rid)
        filled = dict(_filled(fills, bm.block_size, k))
        for j in sorted(grows.keys() | filled.keys()):
            if j in grows:
                assert bm.append_blocks(grows[j])
            for i in filled.get(j, ()):
                running[i].num_computed_tokens = computed[i] + j + 1
                bm.cache_computed_blocks(running[i])
        for i, r in enumerate(running):
            r.num_computed_tokens = computed[i] + k
        return
    if taken[1]:
        assert bm.append_blocks(taken[1])
    if which:
        _cache_filled(bm, running, computed, which, fills, k)


def _filled(fills: list[int], block_size: int, k: int) -> list[tuple[int, list[int]]]:
    """Per step of the run's ``k`` (ascending), the requests (positions in ``running``, ascending)
    whose block fills then: request i's at steps ``fills[i] + m x block_size``."""
    by_step: dict[int, list[int]] = {}
    for i, f in enumerate(fills):
        for j in range(f, k, block_size):
            by_step.setdefault(j, []).append(i)
    return sorted(by_step.items())


def _cache_filled(
    bm: BlockManager, running: list[Request], computed: list[int], which: list[int], fills: list[int], k: int
) -> None:
    """Offer the prefix cache the blocks a deferred run filled (``which``: the requests, by position
    in ``running``, that filled one; ``fills`` as ``settle`` has them; each request already brought
    forward by the run's ``k`` steps from ``computed``), as the steps would have offered them. Per
    request in one call where no two of them can hash a block alike (their first blocks differ in
    tokens or salt: a block's hash chains over every block before it); else step by step, in the
    order the steps offered them."""
    block_size = bm.block_size
    heads = {(running[i].cache_salt, running[i].token_ids_between(0, block_size)) for i in which}
    if len(heads) == len(which):
        for i in which:
            bm.cache_computed_blocks(running[i])
        return
    for j, full in _filled(fills, block_size, k):
        for i in full:
            running[i].num_computed_tokens = computed[i] + j + 1
            bm.cache_computed_blocks(running[i])
    for i in which:
        running[i].num_computed_tokens = computed[i] + k
