"""The block manager's blocks read as objects: ``KVBlock`` snapshots of its ref counts and
prefix-cache hashes by block id (engine.block_manager keeps them as two lists, not one object per
block)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(eq=False, slots=True)
class KVBlock:
    block_id: int
    ref_count: int = 0
    # set while the block is in the prefix cache: its hash, or the engine.deferred_hashes.Chain
    # that will hash it (a block entered without its hash)
    block_hash: Any = None


class Blocks:
    """The pool's blocks by id, read as a sequence of ``num_blocks`` KVBlocks: each a snapshot of
    the manager's ref count and hash of that id (the manager keeps them as two lists by id, grown
    as never-used ids are first taken, so a pool of a million blocks costs nothing until used).
    ``values()``: the blocks used so far (ids below the first never-used one)."""

    def __init__(self, num_blocks: int, refs: list[int], hashes: list[Any]):
        self._num_blocks, self._refs, self._hashes = num_blocks, refs, hashes

    def __getitem__(self, block_id: int) -> KVBlock:
        if not 0 <= block_id < self._num_blocks:
            raise IndexError(f"block id {block_id} is outside the pool of {self._num_blocks}")
        if block_id >= len(self._refs):
            return KVBlock(block_id)
        return KVBlock(block_id, self._refs[block_id], self._hashes[block_id])

    def __len__(self) -> int:
        return self._num_blocks

    def __iter__(self):
        return (self[i] for i in range(self._num_blocks))

    def values(self) -> list[KVBlock]:
        return [self[i] for i in range(len(self._refs))]
