"""Prefix caching through the whole engine: greedy outputs are the same with it on and off while
the hit counters show reuse (tiny random Llama and SmolLM2, fp32), and the cache salt decides
who shares blocks.

The tiny scenario (block_size 4): a 14-token prefix, so its first 3 blocks (12 tokens) are full
and shareable; block 3 mixes the prefix's last 2 tokens with each request's own tokens::

    block:     0      1      2      3
    tokens:  p0-3   p4-7   p8-11  p12 p13 s0 s1 | s2 ...     (p = prefix, s = own suffix)
             <--- 12 tokens hit --->
"""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.request import SamplingParams
from tests.engine.tiny import hf_greedy, random_prompts, tiny_engine, tiny_hf_model

PREFIX_LEN = 14
SUFFIX_LENS = (5, 7, 9, 3)
MAX_TOKENS = 6
PARAMS = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def prefixed_prompts() -> list[list[int]]:
    (prefix,) = random_prompts([PREFIX_LEN], seed=5)
    return [prefix + suffix for suffix in random_prompts(SUFFIX_LENS, seed=6)]


def run_in_three_phases(engine, prompts):
    """Request 0 alone to the end (its prefix blocks then sit cached in the free queue); then 1
    and 2 together (both hit the free cached blocks); one step later, with 1 and 2 still
    running, request 3 (hits blocks that are in use). Returns outputs in prompt order, every
    StepStats, and the StepStats of the step that admitted request 3."""
    outputs, stats = {}, []

    def step():
        out, s = engine.step()
        outputs.update((o.request_id, o) for o in out)
        stats.append(s)
        return s

    engine.add_request(prompts[0], PARAMS, request_id="0")
    while engine.has_unfinished():
        step()
    engine.add_request(prompts[1], PARAMS, request_id="1")
    engine.add_request(prompts[2], PARAMS, request_id="2")
    step()
    engine.add_request(prompts[3], PARAMS, request_id="3")
    admitted_3 = step()
    while engine.has_unfinished():
        step()
    return [outputs[str(i)] for i in range(4)], stats, admitted_3


@pytest.fixture(scope="module")
def tiny_runs():
    prompts = prefixed_prompts()
    on = run_in_three_phases(tiny_engine(enable_prefix_caching=True), prompts)
    off = run_in_three_phases(tiny_engine(enable_prefix_caching=False), prompts)
    return prompts, on, off


def test_tiny_greedy_outputs_are_the_same_with_prefix_caching_on_and_off(tiny_runs):
    prompts, (on, _, _), (off, _, _) = tiny_runs
    hf = tiny_hf_model()
    reference = [hf_greedy(hf, p, MAX_TOKENS, ignore_eos=True) for p in prompts]
    assert [list(o.output_token_ids) for o in on] == reference
    assert [list(o.output_token_ids) for o in off] == reference


def test_tiny_hit_counters_show_the_reuse(tiny_runs):
    _, (on, stats_on, _), (off, stats_off, _) = tiny_runs
    # Requests 1-3 each find the prefix's 3 full blocks: 12 tokens; request 0 found nothing.
    assert [o.num_cached_tokens for o in on] == [0, 12, 12, 12]
    assert sum(s.num_prefix_hit_tokens for s in stats_on) == 36
    # Every admission looks up its whole prompt: 19 + 21 + 23 + 17 tokens.
    assert sum(s.num_prefix_queried_tokens for s in stats_on) == 80
    # A hit skips prefill: 12 fewer prompt tokens computed for each of requests 1-3.
    prefill = lambda stats: sum(s.num_prefill_tokens for s in stats)  # noqa: E731
    assert prefill(stats_off) - prefill(stats_on) == 36
    assert [o.num_cached_tokens for o in off] == [0, 0, 0, 0]
    assert sum(s.num_prefix_queried_tokens + s.num_prefix_hit_tokens for s in stats_off) == 0


def test_tiny_shared_blocks_are_held_once(tiny_runs):
    _, (_, _, admitted_on), (_, _, admitted_off) = tiny_runs
    # After request 3's admission step: requests 1 and 2 hold their prompts (21, 23) plus the
    # first output token decoded in this step; request 3 its 17 prompt tokens (12 of them hit).
    for admitted in (admitted_on, admitted_off):
        assert admitted.kv_resident_tokens == (21 + 1, 23 + 1, 17)
        assert admitted.kv_resident_request_ids == ("1", "2", "3")  # admission order
    blocks = 6 + 6 + 5  # ceil(22 / 4) + ceil(24 / 4) + ceil(17 / 4)
    assert admitted_off.num_used_blocks == blocks
    assert admitted_on.num_used_blocks == blocks - 2 * 3  # three holders of 3 blocks keep one copy


def salt_engine():
    return tiny_engine(num_blocks=32)


def test_same_text_different_salts_share_no_block():
    engine = salt_engine()
    bm = engine.scheduler.block_manager
    (prompt,) = random_prompts([18], seed=9)  # 4 full blocks + 2 tokens
    engine.add_request(prompt, PARAMS, request_id="a", cache_salt="tenant-a")
    engine.step()  # a's prompt is computed and its 4 full blocks are cached
    engine.add_request(prompt, PARAMS, request_id="b", cache_salt="tenant-b")
    engine.add_request(prompt, PARAMS, request_id="a2", cache_salt="tenant-a")
    _, stats = engine.step()
    assert (stats.num_prefix_queried_tokens, stats.num_prefix_hit_tokens) == (36, 16)
    a, b, a2 = (bm.block_table(r) for r in ("a", "b", "a2"))
    assert not set(b) & set(a) and not set(b) & set(a2)  # another tenant: no block in common
    assert a2[:4] == a[:4] and a2[4] != a[4]  # the same tenant shares the 4 full blocks
    assert [bm.blocks[i].ref_count for i in a] == [2, 2, 2, 2, 1]
    # Used: a's 5 blocks (now 19 tokens), b's own 5, a2's last block only.
    assert stats.num_used_blocks == 5 + 5 + 1
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o) for o in engine.step()[0])
    assert {r: o.num_cached_tokens for r, o in done.items()} == {"a": 0, "b": 0, "a2": 16}
    assert done["b"].output_token_ids == done["a"].output_token_ids == done["a2"].output_token_ids


def test_no_salt_and_a_salt_do_not_share_either():
    engine = salt_engine()
    (prompt,) = random_prompts([18], seed=9)
    engine.add_request(prompt, PARAMS, request_id="plain")
    engine.step()
    engine.add_request(prompt, PARAMS, request_id="salted", cache_salt="tenant-a")
    engine.add_request(prompt, PARAMS, request_id="plain2")
    _, stats = engine.step()
    assert stats.num_prefix_hit_tokens == 16  # plain2 only
    bm = engine.scheduler.block_manager
    assert not set(bm.block_table("salted")) & set(bm.block_table("plain"))


# ---- SmolLM2 on real ShareGPT text ------------------------------------------------------------
SMOL_BLOCK = 16


@pytest.fixture(scope="module")
def smollm2_case():
    """A long real ShareGPT turn as the system prompt in front of three real first user turns,
    chat-templated: (engine with caching on, prompts)."""
    from kvplan.traffic.prompts import read_sharegpt, sharegpt_pairs

    pairs = sharegpt_pairs(read_sharegpt())
    engine = smollm2_engine(enable_prefix_caching=True)
    tokenizer = engine.tokenizer
    system = next(text for _, text, _ in pairs if 350 <= len(text) <= 500)
    users = [text for _, text, _ in pairs if 20 <= len(text) <= 120][:3]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": u}],
            add_generation_prompt=True,
            tokenize=True,
        )["input_ids"]
        for u in users
    ]
    return engine, prompts


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def smollm2_engine(**overrides) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            dtype="float32", device="cpu", attention_backend="torch", block_size=SMOL_BLOCK, num_blocks=64, **overrides
        )
    )


def run_first_then_rest(engine, prompts, params):
    outputs = {}
    engine.add_request(prompts[0], params, request_id="0")
    while engine.has_unfinished():
        outputs.update((o.request_id, o) for o in engine.step()[0])
    hits = 0
    for i, p in enumerate(prompts[1:], start=1):
        engine.add_request(p, params, request_id=str(i))
    while engine.has_unfinished():
        out, stats = engine.step()
        hits += stats.num_prefix_hit_tokens
        outputs.update((o.request_id, o) for o in out)
    return [outputs[str(i)] for i in range(len(prompts))], hits


@pytest.mark.smollm2
def test_smollm2_greedy_outputs_are_the_same_with_prefix_caching_on_and_off(smollm2_case):
    engine_on, prompts = smollm2_case
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    on, hits = run_first_then_rest(engine_on, prompts, params)
    off, _ = run_first_then_rest(smollm2_engine(enable_prefix_caching=False), prompts, params)
    # Requests 1 and 2 find the full blocks of what they have in common with request 0.
    shared = [common_prefix_len(p, prompts[0]) // SMOL_BLOCK * SMOL_BLOCK for p in prompts[1:]]
    assert min(shared) >= 4 * SMOL_BLOCK  # the system prompt spans at least 4 full blocks
    assert [o.num_cached_tokens for o in on] == [0, *shared]
    assert hits == sum(shared)
    assert [o.output_token_ids for o in on] == [o.output_token_ids for o in off]
    assert len({o.output_token_ids for o in on}) == 3  # three different questions, three answers
