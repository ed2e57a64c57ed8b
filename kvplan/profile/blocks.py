"""The distinct prefix blocks of a log streamed in arrival order (kvplan.profile.stream): what
``prefix_reuse``, the shared prefixes and the reuse by block position need, in memory that grows
with the distinct blocks, never with the tokens.

A prompt is a chain of *units*, each keyed by a 64-bit hash of the prompt up to and including it:

- a Mooncake line: a unit is one hash id's 512 tokens, keyed by a polynomial hash (mod 2^64, odd
  base, each id mixed by splitmix64) of the ids from the first to it, so equal keys are equal id
  prefixes, and so equal tokens as kvplan.profile.log expands them (an id at or above 2^64 is first
  folded to 64 bits by blake2b);
- a line with token ids (an OpenAI line's text, tokenized): a unit is one full ``block_size``
  block, keyed by the first 8 bytes of the engine's chained block hash (kvplan.profile.stats.block_hashes).

An engine block k of B = ``block_size`` tokens, tokens [kB, (k+1)B), is full when (k+1)B <= n, the
prompt's tokens, and ends in unit J = ((k+1)B - 1) // unit: its chained hash is two prompts' alike
exactly when their keys at J are, and both hold (k+1)B tokens. So each distinct key keeps its
parent's id and the two largest prompt lengths (*reaches*) among the requests through it (24 bytes
a key: the key, its id, the parent, two reaches), and

- block k of a request was seen before (reused) when an earlier request went through unit J with a
  reach >= (k+1)B;
- block k is shared (its hash in two requests) when the second largest reach at J is >= (k+1)B;

each a leading run of the prompt's blocks (a block seen or shared means every block before it is),
so a request keeps only counts and its last unit's id. These are kvplan.profile.stats.prefix_stats'
answers over token ids, exactly, but for key collisions: two distinct prefixes take one key with
probability about 2^-64 a pair, n^2 / 2^65 over n distinct units (below 1e-5 for 15 million), and a
block ending t tokens into a Mooncake unit (``block_size`` not dividing 512) tells two ids apart
only by their first t tokens, alike with probability 2^-15t.

Keys are kept sorted in 256 shards (by their top 8 bits), so a batch of requests is looked up and
inserted with numpy (a few sorts a batch), not a Python object per key.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Any

import numpy as np

from kvplan.profile.stats import PrefixStats, typical_prefix

MOONCAKE_UNIT = 512  # tokens per Mooncake hash id (kvplan.profile.log.MOONCAKE_BLOCK)
_BASE = 0x9E3779B97F4A7C15  # odd, so invertible mod 2^64
_MASK = 2**64 - 1
_SHARD_SHIFT = 56
_NUM_SHARDS = 256
WALK = 1 << 16  # requests walked up their units at a time
_powers: list[np.ndarray] = []  # [BASE^j, BASE^-j] for j < len, mod 2^64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise (uint64 arithmetic wraps)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _power_tables(size: int) -> tuple[np.ndarray, np.ndarray]:
    if not _powers or len(_powers[0]) < size:
        size = max(size, 1024)
        inverse = pow(_BASE, -1, 2**64)
        up, down, a, b = [], [], 1, 1
        for _ in range(size):
            up.append(a)
            down.append(b)
            a, b = a * _BASE & _MASK, b * inverse & _MASK
        _powers[:] = [np.array(up, dtype=np.uint64), np.array(down, dtype=np.uint64)]
    return _powers[0], _powers[1]


def id_array(hash_ids: list[int]) -> np.ndarray:
    """Mooncake hash ids as uint64 (an id at or above 2^64 folded by blake2b, 8 bytes)."""
    try:
        return np.array(hash_ids, dtype=np.uint64)
    except OverflowError:
        folded = [
            h if h <= _MASK else int.from_bytes(hashlib.blake2b(str(h).encode(), digest_size=8).digest())
            for h in hash_ids
        ]
        return np.array(folded, dtype=np.uint64)


def mooncake_keys(ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The unit keys of Mooncake chains: ``ids`` their hash ids concatenated, ``counts`` each chain's
    ids (>= 1). Key j of a chain = mix(sum over i <= j of mix(id_i) x BASE^(j - i)), mod 2^64."""
    starts = np.cumsum(counts) - counts
    position = np.arange(len(ids)) - np.repeat(starts, counts)
    up, down = _power_tables(int(counts.max()))
    g = _mix(ids + np.uint64(_BASE)) * down[position]  # mix(0) is 0: shifted first, as splitmix64 does
    total = np.cumsum(g)  # wraps mod 2^64
    before = np.repeat(total[starts] - g[starts], counts)
    return _mix(up[position] * (total - before))


def token_keys(hashes: list[bytes]) -> np.ndarray:
    """The unit keys of a chain of engine block hashes: their first 8 bytes."""
    return np.array([int.from_bytes(h[:8], "little") for h in hashes], dtype=np.uint64)


class _Grow:
    """An int32 numpy array that grows by a quarter when full."""

    def __init__(self) -> None:
        self.data, self.size = np.zeros(1024, dtype=np.int32), 0

    def extend(self, values: np.ndarray) -> None:
        need = self.size + len(values)
        if need > len(self.data):
            grown = np.zeros(max(need, len(self.data) * 5 // 4), dtype=np.int32)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : need] = values
        self.size = need

    def view(self) -> np.ndarray:
        return self.data[: self.size]


class BlockIndex:
    """The distinct units of the chains fed so far (``add``, requests in arrival order) and, per
    request fed, its counts (module docstring); ``prefix_stats`` the answers."""

    def __init__(self, block_size: int, record: bool = False):
        self.block_size = block_size
        # with ``record``: per batch, its units' ids, tokens and arrivals (kvplan.sizing.reuse_distance)
        self.references: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = [] if record else None
        self._keys = [np.zeros(0, dtype=np.uint64) for _ in range(_NUM_SHARDS)]
        self._ids = [np.zeros(0, dtype=np.int32) for _ in range(_NUM_SHARDS)]
        self.parent, self.reach1, self.reach2 = _Grow(), _Grow(), _Grow()
        # per request fed: its row, chain tokens, unit, units, blocks seen before, last unit's id (-1: none)
        self.rows, self.lengths, self.units, self.counts = array("i"), array("i"), array("i"), array("i")
        self.seen, self.last = array("i"), array("i")

    @property
    def num_units(self) -> int:
        """Distinct units (prefix blocks) so far."""
        return self.parent.size

    def __len__(self) -> int:
        return len(self.lengths)

    def add(
        self,
        rows: np.ndarray,
        lengths: np.ndarray,
        units: np.ndarray,
        counts: np.ndarray,
        keys: np.ndarray,
        arrivals: np.ndarray | None = None,
    ) -> None:
        """A batch of chains, in arrival order after every chain fed before: ``rows`` their requests'
        rows (kvplan.profile.table), ``lengths`` their tokens, ``units`` tokens per unit, ``counts``
        units per chain, ``keys`` the units' keys, chain after chain (``mooncake_keys``, ``token_keys``),
        ``arrivals`` their arrivals (s; kept per unit when the index records references)."""
        num = len(lengths)
        seen = np.zeros(num, dtype=np.int64)
        last = np.full(num, -1, dtype=np.int64)
        if len(keys):
            owner = np.repeat(np.arange(num), counts)
            starts = np.cumsum(counts) - counts
            depth = np.arange(len(keys)) - starts[owner]
            ids = self._ids_of(keys, owner, depth, seen, lengths[owner], units[owner])
            has = counts > 0
            last[has] = ids[(starts + counts - 1)[has]]
            if self.references is not None and arrivals is not None:
                self.references.append((ids, units[owner], arrivals[owner]))
        for column, values in (
            (self.rows, rows),
            (self.lengths, lengths),
            (self.units, units),
            (self.counts, counts),
            (self.seen, seen),
            (self.last, last),
        ):
            column.frombytes(np.ascontiguousarray(values, dtype=np.int32).tobytes())

    def _ids_of(
        self, keys: np.ndarray, owner: np.ndarray, depth: np.ndarray, seen: np.ndarray, n: np.ndarray, unit: np.ndarray
    ) -> np.ndarray:
        """Each key's id (new keys added, their parents set), the blocks seen before added into
        ``seen`` per request, the reaches updated."""
        perm = np.argsort(keys, kind="stable")  # equal keys together, in arrival order
        sorted_keys = keys[perm]
        head = np.ones(len(keys), dtype=bool)
        head[1:] = sorted_keys[1:] != sorted_keys[:-1]
        heads = np.flatnonzero(head)
        group = np.cumsum(head) - 1
        uid = self._lookup(sorted_keys[heads], perm[heads], depth, perm)
        ids = np.empty(len(keys), dtype=np.int64)
        ids[perm] = uid[group]
        new = uid >= self.num_units
        if new.any():
            first = perm[heads][new]
            order = np.argsort(uid[new])
            first, parents = first[order], np.full(int(new.sum()), -1, dtype=np.int64)
            inner = depth[first] > 0
            parents[inner] = ids[first[inner] - 1]
            self.parent.extend(parents)
            self.reach1.extend(np.full(len(parents), -1))
            self.reach2.extend(np.full(len(parents), -1))
        reach1, reach2 = self.reach1.view(), self.reach2.view()
        # the largest reach before each key's use: earlier batches', then earlier in this batch
        sorted_n = n[perm]
        packed = (group << 32) | sorted_n
        running = np.maximum.accumulate(packed)
        before = np.full(len(keys), -1, dtype=np.int64)
        before[1:] = running[:-1] & 0xFFFFFFFF
        before[head] = -1
        before = np.maximum(before, reach1[uid][group])
        block = self.block_size
        sorted_depth, sorted_unit = depth[perm], unit[perm]
        limit = np.minimum(np.minimum(sorted_n, before), (sorted_depth + 1) * sorted_unit)
        count = np.maximum(limit // block - sorted_depth * sorted_unit // block, 0)
        seen += np.bincount(owner[perm], weights=count, minlength=len(seen)).astype(np.int64)
        # the two largest reaches of each key, this batch's merged in
        top1 = np.maximum.reduceat(sorted_n, heads)
        index = np.arange(len(keys))
        at_top = np.where(sorted_n == top1[group], index, len(keys))
        second = sorted_n.copy()
        second[np.minimum.reduceat(at_top, heads)] = -1
        top2 = np.maximum.reduceat(second, heads)
        old1, old2 = reach1[uid], reach2[uid]
        reach1[uid] = np.maximum(old1, top1)
        reach2[uid] = np.maximum(np.maximum(np.minimum(old1, top1), old2), top2)
        return ids

    def _lookup(self, unique: np.ndarray, first: np.ndarray, depth: np.ndarray, perm: np.ndarray) -> np.ndarray:
        """The ids of sorted distinct keys; a key not held yet is added with the next id, new keys
        numbered in the order they first occur (``first``: their first positions in the batch)."""
        uid = np.full(len(unique), -1, dtype=np.int64)
        shard = (unique >> np.uint64(_SHARD_SHIFT)).astype(np.int64)
        bounds = np.searchsorted(shard, np.arange(_NUM_SHARDS + 1))
        for s in np.flatnonzero(np.diff(bounds)):
            lo, hi = bounds[s], bounds[s + 1]
            held, part = self._keys[s], unique[lo:hi]
            at = np.searchsorted(held, part)
            found = at < len(held)
            found[found] = held[at[found]] == part[found]
            uid[lo:hi][found] = self._ids[s][at[found]]
        missing = np.flatnonzero(uid < 0)
        if len(missing):
            rank = np.empty(len(missing), dtype=np.int64)
            rank[np.argsort(first[missing])] = np.arange(len(missing))
            uid[missing] = self.num_units + rank
            for s in np.unique(shard[missing]):
                mine = missing[shard[missing] == s]
                at = np.searchsorted(self._keys[s], unique[mine])
                self._keys[s] = np.insert(self._keys[s], at, unique[mine])
                self._ids[s] = np.insert(self._ids[s], at, uid[mine].astype(np.int32))
        return uid

    def prefix_stats(
        self, num_rows: int, order: np.ndarray, input_tokens: np.ndarray, cached_tokens: np.ndarray
    ) -> PrefixStats:
        """The answers of kvplan.profile.stats.prefix_stats for a log of ``num_rows`` requests whose
        chains were fed: ``order`` its rows in arrival order, ``input_tokens`` and ``cached_tokens``
        (-1: unknown) in that order."""
        block = self.block_size
        rows = np.frombuffer(self.rows, np.int32) if len(self.rows) else np.zeros(0, np.int32)

        def by_arrival(values: array, default: int) -> np.ndarray:
            out = np.full(num_rows, default, dtype=np.int64)
            if len(values):
                out[rows] = np.frombuffer(values, np.int32)
            return out[order]

        lengths, units, counts = by_arrival(self.lengths, -1), by_arrival(self.units, 1), by_arrival(self.counts, 0)
        seen, last = by_arrival(self.seen, 0), by_arrival(self.last, -1)
        chained = lengths >= 0
        num_blocks = np.where(chained, lengths // block, 0)
        reused = seen * block
        cached = ~chained & (cached_tokens >= 0)
        reused[cached] = np.minimum(cached_tokens[cached], input_tokens[cached])
        depth = int(num_blocks.max())
        reach = np.cumsum(np.bincount(num_blocks, minlength=depth + 1)[::-1])[::-1][1:].astype(float)
        hits = np.cumsum(np.bincount(seen, minlength=depth + 1)[::-1])[::-1][1 : depth + 1].astype(float)
        by_block = np.divide(hits, reach, out=np.zeros(depth), where=reach > 0)
        total = int(input_tokens.sum())
        reuse = float(reused.sum() / total) if total else 0.0
        shared, end_unit, end_depth = self._shared(lengths, units, counts, last, num_blocks)
        keys = np.where(shared > 0, end_unit * 2**25 + shared, -1)

        def prefix_ids(carriers: np.ndarray, num: int) -> np.ndarray:
            target = (num * block - 1) // units[carriers]
            return self._ancestors(end_unit[carriers], end_depth[carriers] - target)

        tokens = shared * block
        return PrefixStats(reuse, reused, tokens, keys, by_block, typical_prefix(tokens, block, prefix_ids))

    def _shared(self, lengths, units, counts, last, num_blocks) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per request: its shared blocks, the unit its last shared block ends in and that unit's depth
        (walking up from the last unit while a unit holds none of them)."""
        block, reach2, parent = self.block_size, self.reach2.view(), self.parent.view()
        num = len(lengths)
        shared, end_unit, end_depth = (np.zeros(num, dtype=np.int64) for _ in range(3))
        chained = np.flatnonzero(num_blocks > 0)
        for start in range(0, len(chained), WALK):  # a slice at a time: the walk's arrays stay small
            active = chained[start : start + WALK]
            unit_id, depth = last[active], counts[active] - 1
            while len(active):
                n, size = lengths[active], units[active]
                limit = np.minimum(np.minimum(n, reach2[unit_id]), (depth + 1) * size)
                blocks = limit // block
                done = blocks > depth * size // block
                shared[active[done]] = blocks[done]
                end_unit[active[done]], end_depth[active[done]] = unit_id[done], depth[done]
                up = ~done & (depth > 0)
                active, unit_id, depth = active[up], parent[unit_id[up]].astype(np.int64), depth[up] - 1
        return shared, end_unit, end_depth

    def _ancestors(self, unit_id: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Each unit's ancestor ``steps`` units up."""
        parent, out = self.parent.view(), unit_id.copy()
        active = np.flatnonzero(steps > 0)
        left = steps[active]
        while len(active):
            out[active] = parent[out[active]]
            left -= 1
            keep = left > 0
            active, left = active[keep], left[keep]
        return out

    def summary(self) -> dict[str, Any]:
        """Distinct units and the bytes their index holds (for the bench)."""
        held = sum(k.nbytes + i.nbytes for k, i in zip(self._keys, self._ids))
        return {"num_units": self.num_units, "bytes": held + 3 * 4 * len(self.parent.data)}
