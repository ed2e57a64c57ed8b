"""Decode runs (engine.decode_run) with KV offload tiers on (engine.offload's policy, books only: no
mover, as a simulation keeps them) equal the scheduler stepping one step at a time: every step's
stats (stores, loads, hits by tier, blocks per tier included), every finished request, the pool and
each tier's entries in LRU order. A run stops before a step whose take would evict a cached block,
so a store is counted in its own step (docs/architecture.md, KV offload tiers)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.offload.tiers import Offload
from kvplan.results.records import LevelKey
from kvplan.run.driver import Level, run_level
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.cost import ModelClock
from kvplan.traffic.requests import SampledRequest
from tests.kvplan.run.sim.test_decode_runs import COST, _Capture, cases, facts, pool_state, same_summaries


def run(engine, requests, mode, value, plan, lag, admission, tiers, *, decode_runs: bool) -> _Capture:
    level = Level(LevelKey("b", mode, value, ""), 0, tuple(requests), plan)
    capture = _Capture(level)
    backend = SimBackend(engine, ModelClock(COST, lag), decode_runs=decode_runs, admission=admission)
    bm = backend.scheduler.block_manager
    bm.offload = Offload(*tiers, bytes_per_block=1, block_size=engine.block_size)
    run_level(backend, level, capture, seed=0)
    capture.pool = pool_state(backend) | {t.name: list(t.entries.items()) for t in bm.offload.tiers}
    capture.batches = [len(steps) for steps in capture.batches]
    return capture


TIERS = st.sampled_from([(1, 0), (3, 0), (0, 2), (2, 3), (8, 16)])  # (host blocks, disk blocks)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), TIERS)
def test_decode_runs_with_tiers_equal_the_scheduler_step_by_step(case, tiers):
    engine, *rest = case
    engine = engine.model_copy(update={"enable_prefix_caching": True})  # offload needs it
    fast = run(engine, *rest, tiers, decode_runs=True)
    slow = run(engine, *rest, tiers, decode_runs=False)
    assert fast.steps == slow.steps
    assert fast.finished == slow.finished
    assert fast.pool == slow.pool
    same_summaries(fast, slow)


def test_a_decode_run_stops_where_its_growth_evicts_and_the_evicted_blocks_load_back():
    """One request at a time on 12 blocks of 4 tokens: A (20-token prompt, 20 out: 39 tokens
    computed, 9 full blocks cached, 10 held), then B (8-token prompt, 30 out: 10 blocks) whose
    decode grows into A's freed blocks: the 2 never-used blocks and A's uncached last block first,
    then A's cached ones, tail first (each a store, each in a step of its own), then A's prompt
    again: its first 4 blocks (cap (20 - 1) // 4) from the pool or the host tier."""
    engine = facts(4, 12, 4, 64, True)
    a = tuple(range(1, 21))
    requests = [
        SampledRequest(a, 20, "random"),
        SampledRequest(tuple(range(100, 108)), 30, "random"),
        SampledRequest(a, 4, "random"),
    ]
    case = (engine, requests, "closed", 1, None, 0.0, None, (64, 0))
    fast, slow = run(*case, decode_runs=True), run(*case, decode_runs=False)
    assert fast.steps == slow.steps and fast.finished == slow.finished and fast.pool == slow.pool
    assert max(fast.batches) > 5
    stores = [s["num_host_stores"] for s in slow.steps]
    (hit,) = [i for i, s in enumerate(slow.steps) if s["num_prefix_hit_tokens"]]
    # B's 10 blocks: 2 never-used, then A's freed ones tail first: A's uncached last block (no
    # store), then A's cached blocks 8, 7, ..., 2: 7 stores, one per step (its decode growth)
    assert sum(stores[:hit]) == 7 and max(stores[:hit]) == 1
    # A again: blocks 0 and 1 still in the pool, 2 and 3 loaded from host (16 tokens hit, 8 from
    # host); its 3 fresh blocks (2 loads + 1 new) evict B's freed blocks tail first: B's uncached
    # last, then B's cached 8 and 7 (2 stores); its decode's 6th block evicts B's 6 (1 store)
    step = slow.steps[hit]
    assert (step["num_prefix_hit_tokens"], step["num_host_loads"], step["num_host_hit_tokens"]) == (16, 2, 8)
    assert (stores[hit], sum(stores[hit + 1 :])) == (2, 1)
