"""The tiny random Llama for fast engine tests, and transformers' greedy generate as the reference.

``tiny-random-llama`` (engine.config.TINY_LLAMA): 2 layers, hidden 64, 4 query heads over
2 KV heads (GQA), head_dim 16, vocab 512, max_position_embeddings 256, weights drawn after
``torch.manual_seed(seed)``. The reference model here is built by transformers from the same seed,
so the engine and ``generate`` run the same weights without sharing any object.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput, StepStats
from engine.request import SamplingParams

TINY = "tiny-random-llama"


def tiny_hf_model(seed: int = 0) -> torch.nn.Module:
    """transformers' own LlamaForCausalLM with the tiny config and seed, fp32, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.config import TINY_LLAMA

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).eval()


def tiny_engine(**overrides) -> LLMEngine:
    """A tiny fp32 engine on CPU (torch backend unless overridden)."""
    settings = dict(model=TINY, dtype="float32", device="cpu", attention_backend="torch", block_size=4, num_blocks=128)
    settings.update(overrides)
    return LLMEngine(EngineConfig(**settings))


def random_prompts(lengths: Sequence[int], seed: int = 1, vocab: int = 512) -> list[list[int]]:
    """Token-id prompts of the given lengths (ids 3.. so none is BOS/EOS)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


@torch.inference_mode()
def hf_greedy(hf_model, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = False) -> list[int]:
    """transformers ``generate(do_sample=False)`` on one unpadded prompt; returns the new ids
    (ending with the EOS id when it stopped there)."""
    kwargs = {}
    if ignore_eos:
        config = copy.deepcopy(hf_model.generation_config)
        config.eos_token_id = None
        kwargs["generation_config"] = config
    out = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return out[0, len(prompt_ids) :].tolist()


def run_to_completion(
    engine: LLMEngine, prompts: Sequence[list[int]], params: SamplingParams
) -> tuple[list[RequestOutput], list[StepStats]]:
    """Add every prompt at once, step until done; outputs in prompt order, plus every StepStats."""
    ids = [engine.add_request(p, params) for p in prompts]
    done: dict[str, RequestOutput] = {}
    stats: list[StepStats] = []
    while engine.has_unfinished():
        outputs, step_stats = engine.step()
        stats.append(step_stats)
        done.update((o.request_id, o) for o in outputs)
    outputs, step_stats = engine.step()  # requests finished outside a step (none expected)
    done.update((o.request_id, o) for o in outputs)
    return [done[i] for i in ids], stats
