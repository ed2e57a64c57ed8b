"""Deferred block hashes (engine.deferred_hashes, on in every SimBackend) change nothing a
simulation shows: on the random workloads of the decode-run tests (hypothesis: prefix-cache
hits on shared prefixes and multi-turn sessions, preemption in tight pools, chunked prefill,
closed and open loop), every step's stats, every finished request and the block manager's state
(cached hashes and where they sit, each block's hash and ref count, the free queue, evictions)
equal those of the same level with every block hashed as it fills; with decode runs and
without. And by hand: a request's blocks hashed only when a second request of its first block
looks them up, or when it comes back from a preemption."""

from hypothesis import HealthCheck, given, settings

from engine.block_manager import BlockManager
from engine.deferred_hashes import Chain
from engine.request import Request, SamplingParams
from kvplan.results.records import LevelKey
from kvplan.run.driver import Level, run_level
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.cost import ModelClock
from tests.kvplan.run.sim.test_decode_runs import COST, _Capture, cases, pool_state


def simulated(engine, requests, mode, value, plan, lag, admission, *, defer: bool, decode_runs: bool):
    level = Level(LevelKey("b", mode, value, ""), 0, tuple(requests), plan)
    capture = _Capture(level)
    backend = SimBackend(
        engine, ModelClock(COST, lag), decode_runs=decode_runs, admission=admission, defer_hashes=defer
    )
    run_level(backend, level, capture, seed=0)
    bm = backend.scheduler.block_manager
    deferred = sum(1 for b in bm.blocks.values() if isinstance(b.block_hash, Chain))
    capture.pool = pool_state(backend)  # the deferred blocks hashed first (BlockManager.settle_deferred)
    return capture, deferred


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_deferred_hashes_change_nothing(case):
    for decode_runs in (True, False):
        lazy, deferred = simulated(*case, defer=True, decode_runs=decode_runs)
        eager, none = simulated(*case, defer=False, decode_runs=decode_runs)
        assert none == 0
        assert lazy.steps == eager.steps
        assert lazy.finished == eager.finished
        assert lazy.pool == eager.pool


def request(rid: str, prompt: list[int], outputs: int = 0) -> Request:
    r = Request(rid, tuple(prompt), SamplingParams(max_tokens=100), 0.0, "salt")
    r.output_token_ids.extend([-1] * outputs)
    r.num_computed_tokens = len(prompt) + outputs
    return r


def test_blocks_are_hashed_when_a_second_request_of_the_class_looks_them_up():
    bm = BlockManager(16, 2)
    bm.defer_hashes()
    a = request("a", [1, 2, 3])
    assert bm.find_cached_prefix(a) == []  # hashes its first block: the class's first request
    assert bm.allocate("a", 3)
    bm.cache_computed_blocks(a)  # block 0 (hashed by the lookup) entered with its hash
    a.output_token_ids.extend([-1] * 4)
    a.num_computed_tokens = 7
    assert bm.allocate("a", 7)
    bm.cache_computed_blocks(a)  # blocks 1-2: filled, entered without hashes
    table = bm.block_table("a")
    chains = [bm.blocks[b].block_hash for b in table[1:3]]
    assert all(isinstance(c, Chain) for c in chains) and len(bm._cached) == 1
    # the hashes hand-chained as the engine chains them (engine.block_manager.hash_block)
    h0 = bm._hashes["a"][0]
    from engine.block_manager import hash_block

    h1 = hash_block(h0, [3, -1], None)
    h2 = hash_block(h1, [-1, -1], None)
    b = request("b", [1, 2, 3, -1, -1, -1, 9])  # the same first block: its lookup settles a's
    assert bm.find_cached_prefix(b) == list(table[:3])
    assert bm._cached == {h0: table[0], h1: table[1], h2: table[2]}
    assert bm._heads[h0] is None  # the class is closed: both hash from now on


def filled(rid: str, prompt: list[int]) -> tuple[BlockManager, Request]:
    """A pool of 16 blocks of 2 in which request ``rid`` has prefilled ``prompt`` and decoded 4
    tokens: its block 0 entered with its hash (the lookup hashed it), the next two deferred."""
    bm = BlockManager(16, 2)
    bm.defer_hashes()
    r = request(rid, prompt)
    bm.find_cached_prefix(r)
    bm.allocate(rid, len(prompt))
    bm.cache_computed_blocks(r)
    r.output_token_ids.extend([-1] * 4)
    r.num_computed_tokens += 4
    bm.allocate(rid, r.num_computed_tokens)
    bm.cache_computed_blocks(r)
    assert [isinstance(bm.blocks[b].block_hash, Chain) for b in bm.block_table(rid)] == [False, True, True]
    return bm, r


def test_a_preempted_request_finds_the_blocks_it_filled_without_hashes():
    bm, a = filled("a", [5, 6])
    table = bm.block_table("a")
    bm.free("a", forget=False)  # preempted: its blocks wait in the free queue, still cached
    assert bm.find_cached_prefix(a) == list(table)  # its own blocks back, hashed now
    assert sorted(bm._cached.values()) == sorted(table)


def test_a_deferred_block_taken_for_new_content_is_an_eviction():
    bm, a = filled("a", [5, 6])
    bm.free("a")  # finished: 3 cached blocks at the free queue's tail
    assert bm.allocate("b", 16 * 2)  # the whole pool: 13 never used, then a's 3 (evicted)
    assert bm.num_evictions == 3 and bm._cached == {}
    assert all(b.block_hash is None for b in bm.blocks.values())


def test_the_only_request_of_its_class_hashes_its_first_block_alone():
    """A lookup by the first request of a class hashes block 0 only (nothing of the class can be
    cached); its prompt's other blocks are entered deferred and hashed when a second request of
    the class looks them up, as the engine would have hashed them (hand-chained)."""
    from engine.block_manager import hash_block

    bm = BlockManager(16, 2)
    bm.defer_hashes()
    prompt = [1, 2, 3, 4, 5, 6, 7]
    a = request("a", prompt)
    a.num_computed_tokens = 0
    assert bm.find_cached_prefix(a) == [] and bm.num_hashed(a) == 1
    assert bm.find_cached_prefix(a) == [] and bm.num_hashed(a) == 1  # waiting still: the same
    assert bm.allocate("a", 7)
    a.num_computed_tokens = 7
    bm.cache_computed_blocks(a)  # block 0 with its hash, blocks 1-2 deferred
    table = bm.block_table("a")
    assert [isinstance(bm.blocks[b].block_hash, Chain) for b in table] == [False, True, True, False]
    h0 = hash_block(None, [1, 2], "salt")
    h1 = hash_block(h0, [3, 4], None)
    h2 = hash_block(h1, [5, 6], None)
    assert bm._cached == {h0: table[0]}
    b = request("b", prompt)
    assert bm.find_cached_prefix(b) == list(table[:3])  # a's lookup-free prompt blocks, hashed now
    assert bm._cached == {h0: table[0], h1: table[1], h2: table[2]}
    assert bm._hashes["b"] == [h0, h1, h2]
