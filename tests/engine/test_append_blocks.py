"""BlockManager.append_blocks against allocate one request after another, on random pools and
name lists: names that cycle through their requests (a decode run's stretches, taken by slices)
and names that do not (a block per name in a loop), from never-used and reused blocks."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.block_manager import BlockManager


@st.composite
def cases(draw):
    num_requests = draw(st.integers(1, 6))
    held = draw(st.lists(st.integers(1, 3), min_size=num_requests, max_size=num_requests))
    freed = draw(st.integers(0, 2))  # requests that free their blocks first: reused blocks
    order = draw(st.permutations(range(num_requests)))
    if draw(st.booleans()):  # a cycle through some of them, cut anywhere
        cycle = [f"r{i}" for i in order[: draw(st.integers(1, num_requests))]]
        names = (cycle * 4)[: draw(st.integers(1, 4 * len(cycle)))]
    else:
        names = draw(st.lists(st.sampled_from([f"r{i}" for i in range(num_requests)]), min_size=1, max_size=12))
    return held, freed, names, sum(held) + freed + draw(st.integers(0, 12))


def pool(held: list[int], freed: int, num_blocks: int) -> BlockManager:
    """``held[i]`` blocks for request ri; ``freed`` blocks taken and freed again (the free queue's
    tail, past the never-used ones)."""
    bm = BlockManager(num_blocks=num_blocks, block_size=2, enable_prefix_caching=False)
    for i in range(freed):
        assert bm.allocate(f"x{i}", 2)
    for i, num in enumerate(held):
        assert bm.allocate(f"r{i}", 2 * num)
    for i in range(freed):
        bm.free(f"x{i}")
    return bm


@settings(max_examples=200, deadline=None)
@given(cases())
def test_append_blocks_gives_what_allocate_would_one_after_another(case):
    held, freed, names, num_blocks = case
    mine, theirs = pool(held, freed, num_blocks), pool(held, freed, num_blocks)
    if len(names) > mine.num_free_blocks:  # all or nothing
        names = names[: mine.num_free_blocks]
    if not names:
        return
    assert mine.append_blocks(list(names))
    for name in names:
        assert theirs.allocate(name, 2 * (len(theirs.block_table(name)) + 1))
    for i in range(len(held)):
        assert mine.block_table(f"r{i}") == theirs.block_table(f"r{i}")
    assert mine.free_queue() == theirs.free_queue()
