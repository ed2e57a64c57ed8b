"""Deferred block hashes: a request's filled blocks entered in the prefix cache without hashing
them, while no other request can tell (BlockManager.defer_hashes; the simulator turns it on, the
engine does not).

Two blocks can carry the same chained hash only if their requests share the first block (its
tokens and cache salt: a block's hash chains over every block before it). So the blocks a request
fills are looked up, evicted or found already cached only by requests of its first block's
*class* (``hashes[0]``). While a request is the only one its class has ever had and has not been
preempted (its ``Chain`` is open), every block it fills is cached (no other block can carry its
hash, and its own blocks differ by position), and no lookup can reach them; so the manager marks
each such block as cached by the request's ``Chain`` (the block's hash slot holds the Chain, not a
hash) and hashes nothing. The hashes are computed, and the blocks entered in the cache dict where
they still sit, only when that could be seen (``settle``): when a second request hashes a first
block of the class, or a lookup starts from it (the owner back from a preemption). An evicted
deferred block counts as an eviction like any cached block (``BlockManager._take_free``). After
``settle`` the class is closed: its requests hash as without deferral. With offload tiers on
(which store each evicted block by its hash) the manager never defers.

The block manager's state with deferral, once ``BlockManager.settle_deferred`` has settled every
Chain, equals its state without (tests/kvplan/run/sim/test_deferred_hashes.py: whole simulated
levels compared, steps, requests and pools).
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Any

from engine.request import Request


class Chain:
    """The deferred blocks of one request: table positions ``first``..``end - 1`` of ``table``
    (those whose hash slot still holds this Chain are cached; ``live`` of them), its tokens and
    salt to hash them with later, ``hashes`` the manager's list of its hashes so far (the same
    list object while the request runs). ``open``: the request may defer more blocks."""

    __slots__ = ("request_id", "prompt", "given", "outputs", "salt", "hashes", "table", "first", "end", "live", "open")

    def __init__(self, request: Request, hashes: list[bytes]):
        self.request_id = request.request_id
        self.prompt: tuple[int, ...] = request.prompt_token_ids
        self.given = request.prompt_hashes  # the prompt's full blocks' hashes, where they come from a source
        self.outputs: list[int] = request.output_token_ids  # the request's own list: it grows as it decodes
        self.salt = request.cache_salt
        self.hashes = hashes
        self.table: tuple[int, ...] = ()
        self.first = self.end = 0
        self.live = 0
        self.open = True


def first_block(bm: Any, request: Request, hashes: list[bytes]) -> None:
    """``request`` has just hashed its first block (``hashes[0]``): the first of its class opens a
    Chain; a later one settles the class's Chain and closes the class (None)."""
    heads, head = bm._heads, hashes[0]
    owner = heads.get(head, heads)  # heads itself: never seen
    if owner is heads and bm.offload is None:  # tiers store each evicted block by its hash
        chain = heads[head] = Chain(request, hashes)
        bm._open[request.request_id] = chain
    elif owner is not None and owner is not heads:
        settle(bm, owner)


def defer(bm: Any, chain: Chain, table: tuple[int, ...], start: int, stop: int) -> None:
    """Enter table positions ``start``..``stop - 1`` (blocks just filled, never hashed) as cached
    by ``chain``, hashing nothing."""
    block_hash_of = bm._block_hash
    if not chain.end:
        chain.first = start
    for block_id in table[start:stop]:
        if block_hash_of[block_id] is None:  # as cache_computed_blocks: a block cached already stays as it is
            block_hash_of[block_id] = chain
            chain.live += 1
    chain.table, chain.end = table, stop


def settle(bm: Any, chain: Chain) -> None:
    """Hash ``chain``'s deferred blocks and enter those still cached in the cache dict, as they
    would have been entered when filled; close the Chain and its class."""
    if bm._open.get(chain.request_id) is chain:
        del bm._open[chain.request_id]
    chain.open = False
    bm._heads[chain.hashes[0]] = None
    if chain.live:
        hashes = chain.hashes
        if len(hashes) < chain.end:
            _extend(hashes, chain, bm.block_size)
        block_hash_of, cached = bm._block_hash, bm._cached
        table = chain.table
        for i in range(chain.first, chain.end):
            block_id = table[i]
            if block_hash_of[block_id] is chain:
                block_hash_of[block_id] = hashes[i]
                cached[hashes[i]] = block_id
    release(chain)


def release(chain: Chain) -> None:
    """Drop what only hashing ``chain``'s blocks needed (none of them is cached any more)."""
    chain.live = 0
    chain.prompt, chain.outputs, chain.table, chain.given = (), [], (), None


def _extend(hashes: list[bytes], chain: Chain, block_size: int) -> None:
    """``hashes`` (at least the first block's) grown to ``chain.end`` blocks from the chain's tokens,
    as BlockManager._block_hashes chains them (the prompt's full blocks from its source, if any)."""
    if chain.given is not None and len(hashes) < min(chain.end, len(chain.prompt) // block_size):
        hashes.extend((chain.given(block_size, chain.salt, chain.end) or ())[len(hashes) :])
    start, stop, prompt = len(hashes) * block_size, chain.end * block_size, chain.prompt
    if start >= stop:
        return
    num_prompt = len(prompt)
    tokens = [*prompt[start:stop]]
    if stop > num_prompt:
        tokens += chain.outputs[max(start - num_prompt, 0) : stop - num_prompt]
    raw, width = array("q", tokens).tobytes(), 8 * block_size
    parent, blake2b = hashes[-1], hashlib.blake2b
    for offset in range(0, len(raw), width):
        parent = blake2b(parent + raw[offset : offset + width], digest_size=16).digest()
        hashes.append(parent)
