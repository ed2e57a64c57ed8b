"""engine.free_queue.FreeQueue against an OrderedDict kept beside it (the structure it replaced):
the same ids in the same order after every operation, whatever joins, leaves from the middle,
comes back, or is taken off the front, with the list's head dropped often (COMPACT_AT small)."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import free_queue
from engine.free_queue import FreeQueue

OPS = st.lists(st.tuples(st.sampled_from(["join", "remove", "take", "front"]), st.integers(0, 40)), max_size=120)


@settings(max_examples=300)
@given(ops=OPS, compact_at=st.sampled_from([1, 3, 8, 4096]))
def test_free_queue_is_the_ordered_dict_it_replaced(ops, compact_at):
    old, free_queue.COMPACT_AT = free_queue.COMPACT_AT, compact_at
    try:
        queue, model = FreeQueue(), OrderedDict()
        held = list(range(24))  # ids not in the queue (in use)
        for op, n in ops:
            if op == "join" and held:  # a request's table joins, tail first
                joined = held[: 1 + n % 5][::-1]
                del held[: 1 + n % 5]
                if n % 2:
                    queue.extend(joined)
                else:
                    for block in joined:
                        queue.append(block)
                model.update((b, None) for b in joined)
            elif op == "remove" and model:  # a prefix-cache hit revives a block from anywhere
                block = list(model)[n % len(model)]
                queue.remove(block)
                del model[block]
                held.append(block)
            elif op == "take":
                num = min(n % 7, len(model))
                want = list(model)[:num]
                assert queue.take(num) == want
                for block in want:
                    del model[block]
                held += want
            elif op == "front":
                assert queue.front(n % 9) == list(model)[: n % 9]
            assert len(queue) == len(model)
            assert list(queue) == list(model)
    finally:
        free_queue.COMPACT_AT = old


def test_a_block_freed_again_after_a_hit_is_live_once_at_its_new_place():
    """Ids 0 1 2 join; 1 is hit (taken from the middle) and freed again: the list holds 1 twice,
    the first occurrence stale. The front skips it, and take passes it without giving it."""
    queue = FreeQueue()
    queue.extend([0, 1, 2])
    queue.remove(1)
    queue.append(1)
    assert list(queue) == [0, 2, 1] and len(queue) == 3
    assert queue.front(2) == [0, 2]
    assert queue.take(2) == [0, 2]
    assert list(queue) == [1] and queue.take(1) == [1] and len(queue) == 0
    assert queue.take(0) == [] and list(queue) == []


def test_a_block_hit_and_freed_again_forever_keeps_the_list_bounded():
    """A shared prefix's block, hit and freed again by every request while the front is never
    reached: the list is rebuilt of its live ids, not grown by one stale id a request."""
    queue = FreeQueue()
    queue.extend(range(10))
    for _ in range(100_000):
        queue.remove(3)
        queue.append(3)
    assert len(queue._ids) <= 3 * len(queue) + free_queue.COMPACT_AT + 1
    assert list(queue) == [0, 1, 2, 4, 5, 6, 7, 8, 9, 3]
    assert queue.take(10) == [0, 1, 2, 4, 5, 6, 7, 8, 9, 3] and len(queue) == 0 and queue.front(10) == []
