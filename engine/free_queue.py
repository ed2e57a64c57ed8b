"""FreeQueue: the block manager's queue of freed blocks, least recently freed first.

The queue needs four operations: freed blocks join at the tail (a finished request's whole table
at once), allocation takes from the front (a new request's prompt blocks at once), a prefix-cache
hit takes one block out of the middle, and lookups read the front in order. An ``OrderedDict``
does all four in O(1), but a block at a time at some 100-200 ns each (CPython's linked nodes), and
a long request moves hundreds of blocks: a 1,024 + 8,192-token request at block size 16 holds 576,
and the block manager's loops over blocks were 30 % of a long-output capacity probe's samples, the
queue's inserts alone 12 % (docs/benchmarks.md#issue-35-s23). A plain dict is no better: iterating
from its front after many deletions there walks every deleted entry until the next resize.

Here the queue is a list of block ids with a head index, so joins and takes are list slices (a
few ns a block); a block taken out of the middle stays in the list, marked *stale* (a count per
block id), and is skipped where the front reaches it. A block can be freed again after it was
taken out, so the list may hold a block id several times: only its last occurrence is live (the
stale ones come first), which is why the marks count occurrences rather than flag ids. The list
drops the passed head once it is more than half the list, and is rebuilt of its live ids once its
stale occurrences outnumber them twice (both amortised O(1) a block).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

COMPACT_AT = 4096  # the head drops passed ids once they are this many and half the list


class FreeQueue:
    """Block ids in the order they were freed (front: next to reuse), each at most once.

    The caller keeps the invariants the block manager has: an id joins only while it is not in
    the queue, and ``remove`` / ``take`` ask only for ids that are. Iteration gives the live ids
    front first; the queue must not change during it.
    """

    __slots__ = ("_ids", "_head", "_stale", "_len")

    def __init__(self) -> None:
        self._ids: list[int] = []
        self._head = 0  # _ids[:_head] are passed (taken, or stale and skipped)
        self._stale: dict[int, int] = {}  # block id -> its stale occurrences in _ids[_head:]
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        ids = islice(self._ids, self._head, None)
        if not self._stale:
            return ids
        return _live(ids, self._stale)

    def front(self, num: int) -> list[int]:
        """The first ``num`` ids (fewer where the queue is shorter), left in the queue."""
        ids, head, stale = self._ids, self._head, self._stale
        out = ids[head : head + num]
        if stale and not stale.keys().isdisjoint(out):
            out = [*islice(_live(islice(ids, head, None), stale), num)]
        return out

    def append(self, block_id: int) -> None:
        """``block_id`` (not in the queue) joins at the tail."""
        self._ids.append(block_id)
        self._len += 1

    def extend(self, block_ids: Sequence[int]) -> None:
        """``block_ids`` (none in the queue, distinct) join at the tail in this order."""
        self._ids.extend(block_ids)
        self._len += len(block_ids)

    def remove(self, block_id: int) -> None:
        """Take ``block_id`` (in the queue) out of it, wherever it is. Where stale occurrences
        outnumber twice the live ids (and ``COMPACT_AT``), the list is rebuilt of the live ones:
        a prefix block hit and freed again by every request would otherwise grow it without bound
        while the front is never reached (a pool that still has never-used blocks)."""
        self._stale[block_id] = self._stale.get(block_id, 0) + 1
        self._len -= 1
        if len(self._ids) - self._head - self._len > 2 * self._len + COMPACT_AT:
            self._ids, self._head, self._stale = [*self], 0, {}

    def take(self, num: int) -> list[int]:
        """The first ``num`` ids (0 <= num <= len), taken off the front, in order."""
        if num <= 0:
            return []
        ids, head, stale = self._ids, self._head, self._stale
        out = ids[head : head + num]
        if stale and not stale.keys().isdisjoint(out):  # a stale id among them: walk past it
            out, head = _take_walking(ids, head, num, stale)
        else:
            head += num
        self._len -= num
        if head >= COMPACT_AT and 2 * head >= len(ids):
            del ids[:head]
            head = 0
        self._head = head
        return out


def _live(ids: Iterable[int], stale: dict[int, int]) -> Iterator[int]:
    """``ids`` without their stale occurrences (the first ``stale[b]`` of each id b)."""
    skipped: dict[int, int] = {}
    for block_id in ids:
        marks = stale.get(block_id)
        if marks:
            seen = skipped.get(block_id, 0)
            if seen < marks:
                skipped[block_id] = seen + 1
                continue
        yield block_id


def _take_walking(ids: list[int], head: int, num: int, stale: dict[int, int]) -> tuple[list[int], int]:
    """The first ``num`` live ids from ``head`` and the head after them, dropping the stale marks
    of the occurrences passed."""
    out: list[int] = []
    while len(out) < num:
        block_id = ids[head]
        head += 1
        marks = stale.get(block_id)
        if marks:
            if marks == 1:
                del stale[block_id]
            else:
                stale[block_id] = marks - 1
        else:
            out.append(block_id)
    return out, head
