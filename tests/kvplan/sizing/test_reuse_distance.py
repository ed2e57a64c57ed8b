"""kvplan.sizing.reuse_distance: LRU stack distances against a stack walked by hand (Mattson's
algorithm written plainly here) and an LRU cache simulated block by block."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sizing.reuse_distance import previous_reference, reuse_summary, stack_distances


def walked_stack(ids: list[int], tokens: dict[int, int]) -> list[tuple[int, int]]:
    """(reference, distance) per reuse: the stack of blocks, most recent last, walked reference by reference."""
    stack: list[int] = []
    out = []
    for t, block in enumerate(ids):
        if block in stack:
            at = stack.index(block)
            out.append((t, sum(tokens[b] for b in stack[at + 1 :])))
            stack.remove(block)
        stack.append(block)
    return out


def lru_hits(ids: list[int], tokens: dict[int, int], capacity: int) -> int:
    """Reuses an LRU cache of ``capacity`` tokens hits, blocks evicted least recent first until a new one fits."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for block in ids:
        if block in cache:
            hits += 1
            cache.move_to_end(block)
            continue
        while cache and sum(tokens[b] for b in cache) + tokens[block] > capacity:
            cache.popitem(last=False)
        if tokens[block] <= capacity:  # a block over the whole cache empties it and is not kept
            cache[block] = None
    return hits


def test_a_hand_counted_string():
    # A B C A B D C A E, 512 tokens each: the reuses at 3, 4, 6, 7 have B C / C A / A B D / B D C between
    ids = [1, 2, 3, 1, 2, 4, 3, 1, 5]
    assert previous_reference(np.array(ids)).tolist() == [-1, -1, -1, 0, 1, -1, 2, 3, -1]
    reuses, distances = stack_distances(np.array(ids), np.full(9, 512))
    assert reuses.tolist() == [3, 4, 6, 7]
    assert distances.tolist() == [1024, 1024, 1536, 1536]
    times = np.array([0, 0, 1, 2, 2, 2, 5, 6, 6], dtype=float)
    summary = reuse_summary(np.array(ids), np.full(9, 512), times, tier_tokens=(1024, 1536, 2048))
    assert summary["num_references"] == 9 and summary["num_reuses"] == 4
    assert summary["tokens"] == {"p50": 1280.0, "p90": 1536.0, "p99": 1536.0, "max": 1536.0}
    assert summary["seconds"] == {"p50": 3.0, "p90": 4.0, "p99": 4.0, "max": 4.0}
    # a 3-block cache keeps A and B for their first reuses, then D evicts C and C evicts A
    assert [h["hit_share"] for h in summary["lru_hits"]] == [0.0, 0.5, 1.0]


def test_no_reuse():
    summary = reuse_summary(np.array([1, 2, 3]), np.full(3, 16), np.zeros(3), tier_tokens=(64,))
    assert summary["tokens"] is None and summary["seconds"] is None
    assert summary["lru_hits"] == [{"tokens": 64, "hit_share": 0.0}]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 12), min_size=1, max_size=80),
    st.lists(st.integers(1, 4), min_size=13, max_size=13),
    st.integers(1, 30),
)
def test_equal_to_the_walked_stack_and_a_simulated_lru(ids, sizes, capacity):
    tokens = dict(enumerate(sizes))
    weights = np.array([tokens[b] for b in ids])
    reuses, distances = stack_distances(np.array(ids), weights)
    assert list(zip(reuses.tolist(), distances.tolist())) == walked_stack(ids, tokens)
    summary = reuse_summary(np.array(ids), weights, np.arange(len(ids), dtype=float), tier_tokens=(capacity,))
    share = summary["lru_hits"][0]["hit_share"]
    assert round(share * len(reuses)) == lru_hits(ids, tokens, capacity)
