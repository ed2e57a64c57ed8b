"""A trace prompt's block hashes come from its recipe (kvplan.traffic.trace.TracePrompt.block_hashes,
engine.request.Request.prompt_hashes), not from its tokens, and change nothing a simulation shows:
on random traces (shared and unshared hash blocks, prompts cut inside a block, tight pools that
preempt, prefix caching with deferred hashes or with host and disk KV tiers, decode runs, closed
and open loop) every step, every
finished request and the block manager's end state equal those of the same level whose prompts are
plain token tuples hashed token by token (engine.block_hash), up to the hashes' values: the map from
one run's hashes to the other's is one to one. By hand: the recipe's hashes agree between two
prompts exactly where the engine's token hashes do, a shorter prompt's are a prefix of a longer
one's, the salt changes every one, and an engine block that would span two trace blocks gets none."""

from unittest.mock import patch

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import deferred_hashes
from engine.block_manager import hash_block
from engine.offload.tiers import Offload
from kvplan.results.records import LevelKey
from kvplan.results.stats.steady import LevelSchedule
from kvplan.run.driver import Level, run_level
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.cost import ModelClock
from kvplan.traffic.requests import SampledRequest
from kvplan.traffic.trace import TracePrompt
from tests.kvplan.run.sim.test_decode_runs import COST, _Capture, facts, pool_state

VOCAB = 1 << 40  # engine blocks of 2 ids and more hold 64 bits of draws (RECIPE_BITS): hashed from the recipe
SEED = 7


def token_hashes(ids, block_size: int, salt: str | None) -> list[bytes]:
    """The engine's chained hashes of the full blocks of ``ids`` (engine.block_hash.hash_block)."""
    out: list[bytes] = []
    for i in range(len(ids) // block_size):
        block = ids[i * block_size : (i + 1) * block_size]
        out.append(hash_block(out[-1] if out else None, block, None if i else salt))
    return out


PROMPTS = [  # (line, hash ids or None, length); block_tokens 8
    (1, (0, 1, 2), 24),
    (2, (0, 1, 3), 20),  # the first 2 blocks shared with line 1, cut inside its third
    (3, (0, 1), 12),  # a prefix of line 1's
    (4, (5, 1, 2), 24),  # block 1 and 2's ids as line 1's, after another first block: nothing shared
    (5, None, 19),  # its own blocks
    (6, None, 19),  # its own, again: shared with nothing
    (7, (0,), 3),  # no full engine block
]


def test_recipe_hashes_agree_where_the_token_hashes_do():
    prompts = [TracePrompt(SEED, VOCAB, 8, line, ids, length) for line, ids, length in PROMPTS]
    for block_size in (2, 4, 8):
        for salt in (None, "s"):
            recipe = [p.block_hashes(block_size, salt, 99) for p in prompts]
            tokens = [token_hashes(p.ids(), block_size, salt) for p in prompts]
            assert [len(r) for r in recipe] == [length // block_size for _, _, length in PROMPTS]
            for a in range(len(prompts)):
                for b in range(len(prompts)):
                    for j in range(min(len(recipe[a]), len(recipe[b]))):
                        assert (recipe[a][j] == recipe[b][j]) == (tokens[a][j] == tokens[b][j]), (a, b, j)
            assert recipe[2] == recipe[0][: len(recipe[2])]  # a shorter prompt: a prefix
            assert recipe[1][: 16 // block_size] == recipe[0][: 16 // block_size]  # 2 shared trace blocks
            assert not set(recipe[3]) & set(recipe[0])  # the same later ids after another first block
            assert not {h for r in recipe for h in r} & {h for t in tokens for h in t}  # not the token hashes
            for count in range(len(recipe[0]) + 1):  # the first count of them, alone
                assert prompts[0].block_hashes(block_size, salt, count) == recipe[0][:count]
        salted, plain = prompts[0].block_hashes(4, "a", 9), prompts[0].block_hashes(4, None, 9)
        assert not set(salted) & set(plain) and not set(salted) & set(prompts[0].block_hashes(4, "b", 9))
    assert prompts[0].block_hashes(3, None, 9) is None and prompts[0].block_hashes(16, None, 9) is None
    # fewer than 64 bits of draws a block (RECIPE_BITS): distinct blocks' ids can agree, so the ids are hashed
    small = TracePrompt(SEED, 512, 8, 1, (0, 1, 2), 24)  # 9 bits an id
    assert small.block_hashes(4, None, 9) is None and len(small.block_hashes(8, None, 9)) == 3
    assert TracePrompt(SEED, 1, 8, 1, (0,), 8).block_hashes(8, None, 9) is None


@st.composite
def traces(draw):
    """Trace lines as a trace workload reads them, a pool and a level: lines drawing hash ids from
    a small set (so prompts share leading blocks) or blocks of their own, cut anywhere in their
    last block; ``block_tokens`` a multiple of the engine block or not (then the tokens are hashed)."""
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    block_tokens = draw(st.sampled_from([4, 6, 8, 16]))
    vocab = draw(st.sampled_from([VOCAB, 512]))  # 512: blocks under 8 ids are hashed from their ids
    requests = []
    for line in range(1, draw(st.integers(1, 10)) + 1):
        count = draw(st.integers(1, 4))
        length = draw(st.integers((count - 1) * block_tokens + 1, count * block_tokens))
        own = draw(st.booleans())
        ids = None if own else tuple(draw(st.lists(st.integers(0, 3), min_size=count, max_size=count)))
        prompt = TracePrompt(SEED, vocab, block_tokens, line, ids, length)
        requests.append(SampledRequest(prompt, draw(st.integers(1, 30)), f"trace:{line}"))
    longest = max(r.num_tokens for r in requests)
    least = -(-longest // block_size)
    num_blocks = draw(st.integers(least, least * 4))  # tight pools preempt
    engine = facts(block_size, num_blocks, draw(st.integers(1, 8)), draw(st.integers(4, 64)), True)
    mode = draw(st.sampled_from(["closed", "open"]))
    value = draw(st.integers(1, 10)) if mode == "closed" else draw(st.sampled_from([50.0, 2000.0]))
    plan = draw(st.sampled_from([None, LevelSchedule(num_requests=len(requests), warmup_requests=2)]))
    tiers = draw(st.sampled_from([None, None, (1, 0), (2, 3), (8, 16)]))  # host and disk KV tiers' blocks
    return engine, requests, mode, value, plan, draw(st.booleans()), tiers


def simulated(engine, requests, mode, value, plan, decode_runs, tiers) -> _Capture:
    level = Level(LevelKey("b", mode, value, ""), 0, tuple(requests), plan)
    capture = _Capture(level)
    backend = SimBackend(engine, ModelClock(COST), decode_runs=decode_runs)
    bm = backend.scheduler.block_manager
    if tiers is not None:  # as tests/kvplan/run/sim/test_decode_runs_offload.py sets them
        bm.offload = Offload(*tiers, bytes_per_block=1, block_size=engine.block_size)
    run_level(backend, level, capture, seed=0)
    capture.pool = pool_state(backend)
    capture.pool["tiers"] = [list(t.entries.items()) for t in bm.offload.tiers] if tiers is not None else []
    return capture


def one_to_one(recipe: dict, tokens: dict) -> dict:
    """The map from ``recipe``'s end state's hashes to ``tokens``' (block by block, and each tier's
    entries in LRU order), asserted one to one and carrying one prefix cache onto the other."""
    blocks_a, blocks_b = recipe["blocks"], tokens["blocks"]
    assert blocks_a.keys() == blocks_b.keys()
    to: dict = {}
    for block_id, (hash_a, refs_a) in blocks_a.items():
        hash_b, refs_b = blocks_b[block_id]
        assert refs_a == refs_b and (hash_a is None) == (hash_b is None)
        if hash_a is not None:
            assert to.setdefault(hash_a, hash_b) == hash_b
    assert len(recipe["tiers"]) == len(tokens["tiers"])
    for tier_a, tier_b in zip(recipe["tiers"], tokens["tiers"], strict=True):
        assert len(tier_a) == len(tier_b)
        for (hash_a, entry_a), (hash_b, entry_b) in zip(tier_a, tier_b, strict=True):
            assert entry_a == entry_b and to.setdefault(hash_a, hash_b) == hash_b
    assert len(set(to.values())) == len(to)
    assert {to[h]: b for h, b in recipe["cached"].items()} == tokens["cached"]
    assert (recipe["free"], recipe["evictions"]) == (tokens["free"], tokens["evictions"])
    return to


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_recipe_hashes_change_nothing_a_simulation_shows(case):
    engine, requests, mode, value, plan, decode_runs, tiers = case
    plain = [SampledRequest(tuple(r.prompt_token_ids), r.max_tokens, r.source) for r in requests]
    recipe_hashes, opened = TracePrompt.block_hashes, deferred_hashes.first_block
    with (
        patch.object(TracePrompt, "block_hashes", autospec=True, side_effect=recipe_hashes) as asked,
        patch.object(deferred_hashes, "first_block", side_effect=opened) as classes,
    ):
        recipe = simulated(engine, requests, mode, value, plan, decode_runs, tiers)
    with patch.object(deferred_hashes, "first_block", side_effect=opened) as token_classes:
        tokens = simulated(engine, plain, mode, value, plan, decode_runs, tiers)
    assert recipe.steps == tokens.steps
    assert recipe.finished == tokens.finished
    one_to_one(recipe.pool, tokens.pool)
    # the hashes deferred alike (engine.deferred_hashes: each first block's class, opened or settled)
    assert classes.call_count == token_classes.call_count
    # a prompt's first full block is hashed by its lookup or once computed: asked of the recipe
    assert asked.called == any(len(r.prompt_token_ids) >= engine.block_size for r in requests)


def test_trace_tokens_read_as_the_tuple_of_their_ids():
    """TraceTokens (what a simulated engine's request holds) against the prompt's ids: slices are
    views equal to the tuple's slices, indexing, iteration, ``+``, equality and hashing as a tuple."""
    prompt = TracePrompt(SEED, 512, 8, 1, (0, 1, 2), 21)
    ids, tokens = prompt.ids(), prompt.tokens()
    assert len(tokens) == 21 and tuple(tokens) == ids and tokens == ids and hash(tokens) == hash(ids)
    for start in range(0, 22, 3):
        for stop in range(start, 22, 2):
            part = tokens[start:stop]
            assert isinstance(part, type(tokens)) and part == ids[start:stop] and len(part) == stop - start
            assert part[1:] == ids[start:stop][1:] and {part: 1}.get(ids[start:stop]) == 1
            assert prompt.ids_between(start, stop) == ids[start:stop]
    assert [tokens[i] for i in range(-21, 21)] == [*ids, *ids] and tokens[9:][0] == ids[9]
    assert tokens[19:] + (-1, -1) == ids[19:] + (-1, -1) and (5,) + tokens[:2] == (5, *ids[:2])
    assert tokens[30:] == () and tokens != ids[:-1] and tokens[:8] != prompt.tokens()[8:16]
