"""Prompt logits (``SamplingParams.num_prompt_logits``): the scoring path teacher forcing needs,
checked against transformers' forward logits on the tiny model in fp32."""

from __future__ import annotations

import pytest
import torch

from engine.request import SamplingParams
from tests.engine.fp8_reference import hf_logits
from tests.engine.tiny import random_prompts, run_to_completion, tiny_engine, tiny_hf_model

A, B, C = random_prompts((30, 13, 21), seed=11)


@pytest.fixture(scope="module")
def hf_model():
    return tiny_hf_model()


def test_every_prompt_position_equals_transformers_forward_across_chunks_and_batch(hf_model):
    """A (30 tokens, all logits) and C (21 tokens, the last 6) are prefilled in chunks of a shared
    8-token budget next to B, which asks for none; every returned row equals transformers'."""
    engine = tiny_engine(max_num_batched_tokens=8)
    a, b, c = engine.generate(
        [A, B, C],
        [
            SamplingParams(max_tokens=3, num_prompt_logits=30),
            SamplingParams(max_tokens=3),
            SamplingParams(max_tokens=3, num_prompt_logits=6),
        ],
    )
    assert a.prompt_logits.shape == (30, 512) and a.prompt_logits.dtype == torch.float32
    torch.testing.assert_close(a.prompt_logits, hf_logits(hf_model, A), rtol=0, atol=1e-5)
    assert b.prompt_logits is None
    # Row i of C's 6 is the next-token logits after prompt position 21 - 6 + i.
    torch.testing.assert_close(c.prompt_logits, hf_logits(hf_model, C)[15:], rtol=0, atol=1e-5)
    # The last row is the distribution the first output token was drawn from (greedy: its argmax).
    assert int(a.prompt_logits[-1].argmax()) == a.output_token_ids[0]


def test_scoring_skips_the_prefix_cache_so_every_position_is_computed(hf_model):
    engine = tiny_engine()  # prefix caching on, block size 4
    engine.generate([A], SamplingParams(max_tokens=1))  # A's 7 full blocks are now cached
    plain, scored = engine.generate(
        [A, A], [SamplingParams(max_tokens=1), SamplingParams(max_tokens=1, num_prompt_logits=30)]
    )
    assert plain.num_cached_tokens == 28  # 7 blocks of 4 hit; the last 2 tokens computed
    assert scored.num_cached_tokens == 0
    torch.testing.assert_close(scored.prompt_logits, hf_logits(hf_model, A), rtol=0, atol=1e-5)


def test_rows_survive_preemption_and_recompute(hf_model):
    """15 blocks of 4: A (30 tokens, 8 blocks) and C (21, 6 blocks) are admitted together, then grow
    to 30 + 12 - 1 and 21 + 12 - 1 tokens (11 + 8 blocks > 15), so one is preempted and its prompt
    recomputed; its rows are rewritten in place."""
    engine = tiny_engine(num_blocks=15)
    params = SamplingParams(max_tokens=12, ignore_eos=True, num_prompt_logits=21)
    (a, c), stats = run_to_completion(engine, [A, C], params)
    assert sum(s.num_preemptions for s in stats) >= 1
    assert a.num_preemptions + c.num_preemptions >= 1
    torch.testing.assert_close(a.prompt_logits, hf_logits(hf_model, A)[9:], rtol=0, atol=1e-5)
    torch.testing.assert_close(c.prompt_logits, hf_logits(hf_model, C), rtol=0, atol=1e-5)


def test_num_prompt_logits_errors():
    engine = tiny_engine()
    with pytest.raises(ValueError, match=r"num_prompt_logits: must be <= the prompt's 13 tokens \(got 14\)"):
        engine.add_request(B, SamplingParams(num_prompt_logits=14))
    with pytest.raises(ValueError, match=r"num_prompt_logits: must be >= 0 \(got -1\)"):
        SamplingParams(num_prompt_logits=-1)
