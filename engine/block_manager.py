"""BlockManager: the KV cache's blocks, their ref counts, every request's block table, the prefix cache.

The pool holds ``num_blocks`` blocks of ``block_size`` token slots each (slot = block_id x
block_size + offset). A request's block table lists its blocks in token order; a new block is
taken only when the last one is full. Blocks with ref count 0 wait in the free queue, least
recently freed first::

    free queue (front = next to reuse)          prefix cache: hash -> block id
    [ 7 | 3 | 9 | 4 ]  <- freed blocks join      only full blocks whose K/V were computed
      ^ popped by allocate(); if it still holds  a hash, the hash is evicted first.

Prefix caching (after vLLM's automatic prefix caching design, docs.vllm.ai "Automatic Prefix
Caching"): full block i of a request gets ``hash(hash of block i-1, token ids of block i, extra)``,
where extra is the request's cache salt for block 0 and nothing after (the chain carries it).
A lookup walks the chain from block 0 until the first miss, never covering the request's last
token (its logits are needed, so at least one token is always computed). A hit block is shared
by ref count; if it sat in the free queue it leaves it. A finished request's blocks join the free
queue tail first, so a shared prefix (the head) stays cached longest.

Offload tiers (engine.offload; off unless ``offload`` is set): an evicted cached block is stored
in a lower tier (host memory, disk); a lookup that misses the pool continues there, and
``allocate`` loads such blocks into fresh ones (their ids are -1 in the lookup's ``PrefixHits``).

Only the BlockManager changes block tables; others read copies.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Mapping, Sequence
from itertools import repeat
from types import MappingProxyType
from typing import Any

from engine import deferred_hashes as deferred
from engine.block_hash import _hash_bytes, hash_block  # noqa: F401 - hash_block: imported from here too
from engine.block_view import Blocks
from engine.free_queue import FreeQueue
from engine.offload.tiers import Offload
from engine.request import Request


class PrefixHits(list):
    """A lookup's hits with offload on: device block ids, -1 where the block is in a lower tier;
    ``loads``: (hash, tier name) of each -1, in order."""

    loads: list[tuple[bytes, str]]


_NO_OFFLOAD: dict[str, Any] = {}


class BlockManager:
    """Allocates and frees KV blocks; owns block tables and the prefix cache.

    Args:
        num_blocks: blocks in the pool.
        block_size: token slots per block.
        enable_prefix_caching: cache full computed blocks by chained hash and share them.

    ``num_evictions`` counts cached blocks reused for new content (cumulative).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1 (got {num_blocks}, {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # ref count and prefix-cache hash (None: not cached) of each block id used so far
        self._refs: list[int] = []
        self._block_hash: list[Any] = []  # bytes, None, or a Chain (engine.deferred_hashes)
        self.blocks = Blocks(num_blocks, self._refs, self._block_hash)  # read-only snapshots
        # The free queue is the never-used ids [_next_unused, num_blocks) in order, then the freed
        # ones in the order they were freed: built in O(1) however large the pool.
        self._next_unused = 0
        self._free = FreeQueue()  # engine.free_queue: list slices, not a block at a time
        self._cached: dict[bytes, int] = {}
        # Tables are tuples, replaced when they grow (every block_size tokens), so readers can
        # keep them; block_tables is the read-only view of all of them.
        self._tables: dict[str, tuple[int, ...]] = {}
        self.block_tables: Mapping[str, tuple[int, ...]] = MappingProxyType(self._tables)
        self._hashes: dict[str, list[bytes]] = {}  # chained hashes of a request's full blocks
        self._num_checked: dict[str, int] = {}  # leading table entries already offered to the cache
        self.num_evictions = 0
        self.offload: Offload | None = None  # lower tiers (engine.offload); None: none
        self._heads: dict[bytes, deferred.Chain | None] | None = None  # deferred hashes' classes; None: off
        self._open: dict[str, deferred.Chain] = {}  # request id -> its open Chain

    def defer_hashes(self) -> None:
        """From now on, enter the blocks a request fills in the prefix cache without hashing them
        while no other request could tell (engine.deferred_hashes); not with offload tiers."""
        if self.offload is None and self.enable_prefix_caching:
            self._heads = {}

    @property
    def deferring(self) -> bool:
        return self._heads is not None

    def num_hashed(self, request: Request) -> int:
        return len(self._hashes.get(request.request_id, ()))

    def settle_deferred(self) -> None:
        """Hash every deferred block and enter it in the cache dict where it is still cached."""
        for chain in [c for c in (self._heads or {}).values() if c is not None]:
            deferred.settle(self, chain)

    # ---- views -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0, cached ones included (they are evicted on demand)."""
        return self.num_blocks - self._next_unused + len(self._free)

    @property
    def num_fresh_blocks(self) -> int:
        """Free blocks never used yet: the front of the free queue; taking them evicts nothing."""
        return self.num_blocks - self._next_unused

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref count >= 1; a block shared by several requests counts once."""
        return self._next_unused - len(self._free)

    def free_queue(self) -> list[int]:
        """Free block ids, next to be reused first."""
        return [*range(self._next_unused, self.num_blocks), *self._free]

    def block_table(self, request_id: str) -> tuple[int, ...]:
        """The request's block ids in token order; () for a request holding none."""
        return self._tables.get(request_id, ())

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache ------------------------------------------------------------------
    def _block_hashes(self, request: Request, num_tokens: int) -> list[bytes]:
        """Chained hashes of the request's first ``num_tokens // block_size`` full blocks (the
        manager's own list when it holds exactly those: read it, never change it)."""
        hashes = self._hashes.setdefault(request.request_id, [])
        num_full = num_tokens // self.block_size
        first, width = len(hashes), 8 * self.block_size  # int64 bytes per block
        given_by = request.prompt_hashes  # the prompt's full blocks' from their source (Request)
        if given_by is not None and first < num_full and first < len(request.prompt_token_ids) // self.block_size:
            given = given_by(self.block_size, request.cache_salt, num_full) or ()
            if first < len(given):
                hashes.extend(given[first:])
                if not first and self._heads is not None:
                    deferred.first_block(self, request, hashes)
                first = len(hashes)
        if first < num_full:  # only the blocks not hashed yet are read: a long request's tokens are not copied whole
            raw = array("q", request.token_ids_between(first * self.block_size, num_full * self.block_size)).tobytes()
            begin = 0
            if first:
                parent = hashes[-1]
            else:  # block 0 carries the salt; the chain carries it after (``_hash_bytes`` inlined below)
                parent = _hash_bytes(None, raw[:width], request.cache_salt)
                hashes.append(parent)
                begin = width
                if self._heads is not None:
                    deferred.first_block(self, request, hashes)
            blake2b = hashlib.blake2b
            for offset in range(begin, len(raw), width):
                parent = blake2b(parent + raw[offset : offset + width], digest_size=16).digest()
                hashes.append(parent)
        return hashes if len(hashes) == num_full else hashes[:num_full]

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Block ids of the longest cached prefix of ``request``'s tokens; changes nothing.

        Capped at ``(num_tokens - 1) // block_size`` blocks so the last token is always computed.
        """
        if not self.enable_prefix_caching:
            return []
        if self.offload is not None:
            return self._find_in_tiers(request, self.offload)
        hits: list[int] = []
        if self._heads is not None and request.num_tokens > self.block_size:
            # deferring: the first block alone says whether the request is the only one of its
            # class (an open Chain: no block of the class is cached, as it holds none yet; its
            # other blocks are hashed only where a settle needs them, engine.deferred_hashes)
            self._block_hashes(request, self.block_size)
            if request.request_id in self._open:
                return hits
        hashes = self._block_hashes(request, request.num_tokens - 1)
        if hashes and self._heads is not None and (chain := self._heads.get(hashes[0])) is not None and chain.live:
            deferred.settle(self, chain)  # its owner back from a preemption: the blocks it left
        for block_hash in hashes:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _find_in_tiers(self, request: Request, offload: Offload) -> PrefixHits:
        """find_cached_prefix with lower tiers: each block from the pool, else host, else disk."""
        hits = PrefixHits()
        hits.loads = []
        for block_hash in self._block_hashes(request, request.num_tokens - 1):
            block_id = self._cached.get(block_hash)
            if block_id is None:
                tier = offload.tier_of(block_hash)
                if tier is None:
                    break
                hits.loads.append((block_hash, tier))
                block_id = -1
            hits.append(block_id)
        return hits

    def cache_computed_blocks(self, request: Request) -> None:
        """Enter the request's full blocks whose K/V are computed into the prefix cache.

        A block whose hash is already cached under another block id stays uncached (a duplicate);
        it is freed like any other block.
        """
        if not self.enable_prefix_caching:
            return
        start = self._num_checked.get(request.request_id, 0)
        if request.num_computed_tokens // self.block_size == start:  # no block filled since
            return
        table = self._tables[request.request_id]
        chain, stop = self._open.get(request.request_id), request.num_computed_tokens // self.block_size
        if chain is not None and (known := len(chain.hashes)) < stop:
            deferred.defer(self, chain, table, max(start, known), stop)  # the blocks not hashed yet
            self._num_checked[request.request_id] = stop
            hashes = chain.hashes  # and the ones hashed already (the prompt's, from its lookup) as below
        else:
            hashes = self._block_hashes(request, request.num_computed_tokens)
            self._num_checked[request.request_id] = len(hashes)
        block_hash_of, cached = self._block_hash, self._cached
        for block_hash, block_id in zip(hashes[start:], table[start:]):  # the table holds a block per hash
            if block_hash_of[block_id] is None and block_hash not in cached:
                block_hash_of[block_id] = block_hash
                cached[block_hash] = block_id

    def uncached_hashes(self, request: Request) -> list[bytes]:
        """Hashes of the request's full computed blocks not yet offered to the cache (what the
        next ``cache_computed_blocks`` would offer, oldest first); changes no cache entry."""
        start = self._num_checked.get(request.request_id, 0)
        if request.request_id in self._open:  # blocks it will defer carry no hash another could
            return self._hashes[request.request_id][start:]
        return self._block_hashes(request, request.num_computed_tokens)[start:]

    def hashes_evicted_by(self, num: int) -> set[bytes]:
        """Prefix-cache hashes that taking ``num`` blocks off the free queue would evict (the
        cached ones among its first ``num``, past the never-used ids); changes nothing."""
        num_old = num - (self.num_blocks - self._next_unused)
        if num_old <= 0 or not self._cached:
            return set()
        block_hash_of = self._block_hash
        return {h for block_id in self._free.front(num_old) if (h := block_hash_of[block_id]) is not None}

    def num_takeable_without_eviction(self) -> int:
        """Blocks the free queue gives before the first cached one (whose take evicts it)."""
        num = self.num_blocks - self._next_unused
        block_hash_of = self._block_hash
        for block_id in self._free:
            if block_hash_of[block_id] is not None:
                break
            num += 1
        return num

    def offload_columns(self) -> dict[str, Any]:
        """The offload StepStats fields of the step now ending (engine.offload.tiers.Offload.
        step_columns); {} with offload off."""
        return _NO_OFFLOAD if self.offload is None else self.offload.step_columns()

    # ---- allocation --------------------------------------------------------------------
    def allocate(self, request_id: str, num_tokens: int, cached_block_ids: Sequence[int] = ()) -> bool:
        """Grow ``request_id``'s block table to hold ``num_tokens`` tokens, all or nothing.

        ``cached_block_ids`` (from find_cached_prefix, only for a request holding no blocks) start
        the table and are shared (ref count + 1). Returns False, changing nothing, when the free
        queue cannot supply every block needed.
        """
        table = self._tables.get(request_id, ())
        num_new = -(-num_tokens // self.block_size) - len(table)
        if not cached_block_ids:  # a running request growing (every block_size tokens of a decode)
            if num_new <= 0:
                return True
            if num_new > self.num_free_blocks:
                return False
            self._tables[request_id] = table + self._take_free(num_new)
            return True
        if table:
            raise ValueError(f"{request_id}: cached blocks can only start an empty block table")
        num_new -= len(cached_block_ids)
        loads = getattr(cached_block_ids, "loads", None)
        if loads:
            return self._allocate_loading(request_id, max(num_new, 0), cached_block_ids, loads)
        refs = self._refs
        num_revived = sum(1 for b in cached_block_ids if refs[b] == 0)
        if max(num_new, 0) + num_revived > self.num_free_blocks:
            return False
        for block_id in cached_block_ids:
            if refs[block_id] == 0:
                self._free.remove(block_id)
            refs[block_id] += 1
        self._tables[request_id] = (*cached_block_ids, *self._take_free(num_new))
        return True

    def _allocate_loading(
        self, request_id: str, num_new: int, hits: Sequence[int], loads: list[tuple[bytes, str]]
    ) -> bool:
        """``allocate`` from hits some of which (-1) load from a lower tier: revive the pool's hits,
        read the sources, take fresh blocks for the loads (chain order) then the new ones in one
        take, write the loads in and enter them in the prefix cache (OFFLOAD.md rule 5)."""
        device = [b for b in hits if b >= 0]
        refs = self._refs
        num_revived = sum(1 for b in device if refs[b] == 0)
        if num_new + num_revived + len(loads) > self.num_free_blocks:
            return False
        for block_id in device:
            if refs[block_id] == 0:
                self._free.remove(block_id)
            refs[block_id] += 1
        assert self.offload is not None
        payloads = self.offload.read_sources(loads)
        taken = self._take_free(len(loads) + num_new)
        loaded = taken[: len(loads)]
        self.offload.write_loaded(loaded, loads, payloads)
        for block_id, (block_hash, _) in zip(loaded, loads):
            self._block_hash[block_id] = block_hash
            self._cached[block_hash] = block_id
        fresh = iter(loaded)
        self._tables[request_id] = (*(b if b >= 0 else next(fresh) for b in hits), *taken[len(loads) :])
        return True

    def append_blocks(self, request_ids: Sequence[str]) -> bool:
        """One more block at the end of each of these requests' tables, taken off the free queue
        in this order: the blocks ``allocate`` would give them one request after another, for
        each a block past its last (a request named k times gets k blocks, in order). All or
        nothing: False, changing nothing, when fewer blocks than names are free."""
        num = len(request_ids)
        if num > self.num_free_blocks:
            return False
        taken, tables = self._take_free(num), self._tables
        names = [*dict.fromkeys(request_ids)]  # each once, in the order first named
        cycle = len(names)
        if [*request_ids[:cycle]] == names and request_ids[cycle:] == request_ids[: num - cycle]:
            # the names cycle (a decode run's stretches: each request once per block_size steps):
            # the k-th named gets every cycle-th block from its first (a slice, not a loop per block)
            for first, request_id in enumerate(names):
                tables[request_id] += taken[first::cycle]
            return True
        grown: dict[str, list[int]] = {}
        for request_id, block_id in zip(request_ids, taken):
            grown.setdefault(request_id, []).append(block_id)
        for request_id, block_ids in grown.items():  # a table is copied once, however many it gets
            tables[request_id] += tuple(block_ids)
        return True

    def _take_free(self, num: int) -> tuple[int, ...]:
        """Take ``num`` (<= num_free_blocks; none if below 1) blocks off the front of the free
        queue, each with ref count 1: never-used ids first (made here, holding nothing), then the
        least recently freed (a cached one is evicted: its content is about to be overwritten)."""
        num_fresh = min(max(num, 0), self.num_blocks - self._next_unused)
        first, refs, block_hash_of = self._next_unused, self._refs, self._block_hash
        self._next_unused += num_fresh
        refs.extend(repeat(1, num_fresh))  # the lists by id grow with the never-used ids taken
        block_hash_of.extend(repeat(None, num_fresh))
        num_old = num - num_fresh
        if num_old <= 0:
            return (*range(first, first + num_fresh),)
        old = self._free.take(num_old)  # the least recently freed
        for block_id in old:
            refs[block_id] = 1
        hashes = [*map(block_hash_of.__getitem__, old)]
        if hashes.count(None) < num_old:  # some are cached: evicted in the queue's order
            cached, offload = self._cached, self.offload
            for block_id, block_hash in zip(old, hashes):
                if block_hash is None:
                    continue
                if offload is not None:  # stored before the block is reused (OFFLOAD.md rule 2)
                    offload.evicted(block_id, block_hash)
                if block_hash.__class__ is bytes:
                    del cached[block_hash]
                else:  # a deferred block (engine.deferred_hashes): in no dict
                    block_hash.live -= 1
                    if not block_hash.live and not block_hash.open:
                        deferred.release(block_hash)
                block_hash_of[block_id] = None
                self.num_evictions += 1
        return (*range(first, first + num_fresh), *old)

    def free(self, request_id: str, forget: bool = True) -> None:
        """Release the request's blocks (finish, abort, preemption). ``forget=False`` keeps its
        block hashes for a later lookup (preemption: the tokens will be the same)."""
        self._num_checked.pop(request_id, None)
        if (chain := self._open.pop(request_id, None)) is not None:
            chain.open = False  # preempted or done: from now on it hashes (its deferred blocks stay)
        refs, table = self._refs, self._tables.pop(request_id, ())[::-1]  # tail of the request joins first
        for block_id in table:
            refs[block_id] -= 1
        shared = [*map(refs.__getitem__, table)].count(0) < len(table)  # those stay held; most tables: none
        self._free.extend([b for b in table if not refs[b]] if shared else table)
        if forget:
            self._hashes.pop(request_id, None)
