"""The offload policy and its bookkeeping: which block hashes each lower tier holds, in LRU order,
what a step stored and loaded. Tensor-free: the bytes move through a ``Mover`` (engine.offload.
storage's ``KVMover`` in the engine; none in a simulation, which keeps the books only).

The rules (written for the engine and the simulator alike, /work/helpers/OFFLOAD.md, and
docs/architecture.md#kv-offload-tiers):

- a lower-tier entry is a copy of one full block, keyed by its chained hash (the cache salt is in
  it, so no entry ever serves another salt); no ref counts: no request owns an entry;
- store: when the device pool evicts a cached block to reuse it (BlockManager._take_free), the
  block goes to the next present tier; if that tier holds the hash already it is only touched
  (moved to the LRU's most recent end); a full tier first evicts its least recently used entry
  to the tier below it by the same rule (the last tier drops it);
- lookup: a block the device misses is looked up in host, then disk (no touch);
- load: the admitting step touches each source entry, reads its bytes, then (after the pool's
  take, whose evictions may store) writes them into fresh device blocks; the source entry stays.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

DEVICE, HOST, DISK = "device", "host", "disk"
LOWER_TIERS = (HOST, DISK)


class Mover(Protocol):
    """Moves one block's bytes between tiers (indices: a device block id, a host or disk slot)."""

    def copy(self, src: str, src_index: int, dst: str, dst_index: int) -> None:
        """Copy a block device -> host, device -> disk or host -> disk."""

    def read(self, tier: str, index: int) -> Any:
        """The bytes of a host or disk slot (kept by the caller until ``write_device``)."""

    def write_device(self, block_ids: Sequence[int], payloads: Sequence[Any]) -> None:
        """Write ``payloads`` (from ``read``) into these device blocks, in order."""


class TierIndex:
    """One lower tier: block hash -> slot, least recently used first; ``capacity`` slots (blocks).

    Raises:
        ValueError: a capacity below one block.
    """

    def __init__(self, name: str, capacity: int):
        if capacity < 1:
            raise ValueError(f"{name} tier: capacity must be >= 1 block (got {capacity})")
        self.name, self.capacity = name, capacity
        self.entries: OrderedDict[bytes, int] = OrderedDict()
        self._free_slots = list(range(capacity - 1, -1, -1))  # pop() hands out slot 0 first

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.entries

    @property
    def is_full(self) -> bool:
        return not self._free_slots

    def touch(self, block_hash: bytes) -> int:
        """Move an entry to the most recently used end; returns its slot."""
        self.entries.move_to_end(block_hash)
        return self.entries[block_hash]

    def pop_lru(self) -> tuple[bytes, int]:
        """Remove the least recently used entry; (its hash, its slot). The slot is free again
        only after ``release`` (its bytes may still have to be copied below)."""
        return self.entries.popitem(last=False)

    def release(self, slot: int) -> None:
        self._free_slots.append(slot)

    def put(self, block_hash: bytes) -> int:
        """A new most recently used entry in a free slot (the tier must not be full); its slot."""
        slot = self.entries[block_hash] = self._free_slots.pop()
        return slot

    def check(self) -> None:
        """Raise AssertionError unless every slot is either free or held by exactly one entry."""
        held = sorted(self.entries.values())
        assert len(set(held)) == len(held), f"{self.name}: a slot is held twice"
        assert sorted(held + self._free_slots) == list(range(self.capacity)), f"{self.name}: a slot leaked"


class Offload:
    """The lower tiers of one block pool and the counters of the current step.

    Args:
        host_blocks, disk_blocks: each tier's capacity in blocks; 0 = no such tier (one must be > 0).
        bytes_per_block: one device block's bytes (all layers, K and V): the unit of bytes moved.
        block_size: tokens per block (hit tokens = blocks x block_size).
        mover: moves the bytes; None keeps the books only (a simulation).
    """

    def __init__(self, host_blocks: int, disk_blocks: int, bytes_per_block: int, block_size: int, mover=None):
        self.tiers = [TierIndex(n, c) for n, c in ((HOST, host_blocks), (DISK, disk_blocks)) if c > 0]
        if not self.tiers:
            raise ValueError("offload: give a host or a disk tier of at least one block")
        self.by_name = {t.name: t for t in self.tiers}
        self.bytes_per_block, self.block_size, self.mover = bytes_per_block, block_size, mover
        self._counts = dict.fromkeys(STEP_COUNTERS, 0)
        self.totals = dict.fromkeys(STEP_COUNTERS, 0)  # since construction

    def tier_of(self, block_hash: bytes) -> str | None:
        """The first lower tier holding ``block_hash`` (host before disk), None if none does."""
        for tier in self.tiers:
            if block_hash in tier.entries:
                return tier.name
        return None

    def num_blocks(self, name: str) -> int:
        """Entries the tier holds now (0 for an absent tier)."""
        tier = self.by_name.get(name)
        return len(tier) if tier is not None else 0

    # ---- stores ------------------------------------------------------------------------
    def evicted(self, block_id: int, block_hash: bytes) -> None:
        """The device pool evicts cached block ``block_id`` to reuse it: store it in the next tier."""
        self._store(0, block_hash, DEVICE, block_id)

    def _store(self, level: int, block_hash: bytes, src: str, src_index: int) -> None:
        tier = self.tiers[level]
        if block_hash in tier.entries:
            tier.touch(block_hash)
            return
        if tier.is_full:
            old_hash, old_slot = tier.pop_lru()
            if level + 1 < len(self.tiers):
                self._store(level + 1, old_hash, tier.name, old_slot)
            tier.release(old_slot)
        slot = tier.put(block_hash)
        if self.mover is not None:
            self.mover.copy(src, src_index, tier.name, slot)
        self._count(f"num_{tier.name}_stores", "offload_bytes_stored")

    # ---- loads -------------------------------------------------------------------------
    def read_sources(self, loads: Sequence[tuple[bytes, str]]) -> list[Any]:
        """Before the admitting take: touch each (hash, tier) source entry, in order, and read its
        bytes (None each without a mover)."""
        payloads = []
        for block_hash, name in loads:
            slot = self.by_name[name].touch(block_hash)
            payloads.append(self.mover.read(name, slot) if self.mover is not None else None)
        return payloads

    def write_loaded(self, block_ids: Sequence[int], loads: Sequence[tuple[bytes, str]], payloads: list[Any]) -> None:
        """After the take: write the read bytes into the fresh device ``block_ids``; count loads."""
        if self.mover is not None:
            self.mover.write_device(block_ids, payloads)
        for _, name in loads:
            self._count(f"num_{name}_loads", "offload_bytes_loaded")
            self._counts[f"num_{name}_hit_tokens"] += self.block_size
            self.totals[f"num_{name}_hit_tokens"] += self.block_size

    def _count(self, blocks_key: str, bytes_key: str) -> None:
        for counts in (self._counts, self.totals):
            counts[blocks_key] += 1
            counts[bytes_key] += self.bytes_per_block

    # ---- per step ----------------------------------------------------------------------
    def step_loads(self) -> tuple[int, int]:
        """(host, disk) blocks loaded so far in the step now running (read before its stats)."""
        return self._counts["num_host_loads"], self._counts["num_disk_loads"]

    def step_columns(self) -> dict[str, int]:
        """The StepStats fields of the step now ending: its counters (reset here) and the
        blocks each lower tier holds now."""
        columns = self._counts
        self._counts = dict.fromkeys(STEP_COUNTERS, 0)
        columns["num_host_blocks"] = self.num_blocks(HOST)
        columns["num_disk_blocks"] = self.num_blocks(DISK)
        return columns

    def check(self) -> None:
        """Raise AssertionError if any tier's slots leaked or a tier holds more than its capacity."""
        for tier in self.tiers:
            tier.check()


STEP_COUNTERS = (
    "num_host_stores",
    "num_disk_stores",
    "num_host_loads",
    "num_disk_loads",
    "num_host_hit_tokens",
    "num_disk_hit_tokens",
    "offload_bytes_stored",
    "offload_bytes_loaded",
)
