"""Output tokens/s of our engine against transformers' static-batch ``generate``, same run, same machine.

Workload (as in vLLM's ``benchmark_throughput`` on ShareGPT): the first ``--num-prompts`` ShareGPT
conversations whose first human turn (chat-templated, SmolLM2's tokenizer) is 4..1024 tokens and
whose real reply is at least 4 tokens with prompt + reply <= 2048; each request asks for its real
reply length as ``max_tokens`` (capped at ``--max-output``, default 256) with ``ignore_eos``, so
both sides produce exactly the same number of tokens per request.

- engine: all requests queued at once, ``max_num_seqs = --concurrency`` (32): continuous batching
  keeps 32 in flight and admits the next as soon as one finishes.
- transformers: ``generate`` on static batches of ``--concurrency`` prompts in order, left-padded;
  each batch runs until its longest request's ``max_tokens``. Only the tokens each request asked
  for count as output (the rest of a padded batch is waste, which is what continuous batching saves).

Both in bf16, greedy, SDPA attention on transformers' side. One short warm-up per side first
(weights are memory-mapped: first touches page them in). Prints tokens/s of each and the ratio
(target: engine >= 1.5x). ``--profile`` adds a cProfile of the engine's run.

    .venv/bin/python bench/engine_throughput.py [--num-prompts 64] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import os
import pstats
import time

import torch

from engine.config import DEFAULT_MODEL, EngineConfig
from engine.llm_engine import LLMEngine
from engine.models.loader import load_model
from engine.request import SamplingParams
from kvplan.traffic.prompts import read_sharegpt, sharegpt_pairs


def sample_requests(tokenizer, num_prompts: int, max_output: int) -> list[tuple[list[int], int]]:
    """(prompt ids, max_tokens) for the first conversations that pass vLLM's ShareGPT filter."""
    requests = []
    for _, human, reply in sharegpt_pairs(read_sharegpt()):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": human}], add_generation_prompt=True, tokenize=True
        )["input_ids"]
        reply_len = len(tokenizer(reply)["input_ids"])
        if len(prompt) < 4 or reply_len < 4 or len(prompt) > 1024 or len(prompt) + reply_len > 2048:
            continue
        requests.append((prompt, min(reply_len, max_output)))
        if len(requests) == num_prompts:
            return requests
    raise SystemExit(f"ShareGPT: only {len(requests)} usable conversations, asked for {num_prompts}")


def run_engine(engine: LLMEngine, requests) -> tuple[int, float]:
    """All requests queued at once; returns (output tokens, seconds)."""
    start = time.perf_counter()
    outputs = engine.generate(
        [p for p, _ in requests], [SamplingParams(max_tokens=n, ignore_eos=True) for _, n in requests]
    )
    elapsed = time.perf_counter() - start
    assert all(len(o.output_token_ids) == n for o, (_, n) in zip(outputs, requests))
    return sum(len(o.output_token_ids) for o in outputs), elapsed


@torch.inference_mode()
def run_transformers(model, tokenizer, requests, batch_size: int) -> tuple[int, float]:
    """Static batches of ``batch_size``, left-padded; returns (requested output tokens, seconds)."""
    tokenizer.padding_side = "left"
    start = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        batch = requests[i : i + batch_size]
        config = copy.deepcopy(model.generation_config)
        config.eos_token_id = None  # ignore_eos: every row runs to max_new_tokens
        config.pad_token_id = tokenizer.pad_token_id
        config.do_sample = False
        config.max_new_tokens = max(n for _, n in batch)
        enc = tokenizer.pad({"input_ids": [p for p, _ in batch]}, return_tensors="pt")
        model.generate(**enc, generation_config=config)
    return sum(n for _, n in requests), time.perf_counter() - start


def load() -> str:
    """1-minute load average: on a shared 2-core machine, other processes slow either side a lot
    (torch's threads wait for each other at every op), so a ratio is only fair at a low load."""
    return f"[load {os.getloadavg()[0]:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-output", type=int, default=256)
    parser.add_argument("--profile", action="store_true", help="cProfile the engine run (top 25 by own time)")
    args = parser.parse_args()

    engine = LLMEngine(
        EngineConfig(model=DEFAULT_MODEL, dtype="bfloat16", max_num_seqs=args.concurrency, kv_cache_memory_bytes=2**30)
    )
    tokenizer = engine.tokenizer
    requests = sample_requests(tokenizer, args.num_prompts, args.max_output)
    prompt_lens = [len(p) for p, _ in requests]
    print(
        f"{len(requests)} ShareGPT requests: prompt tokens mean {sum(prompt_lens) / len(requests):.0f} "
        f"(max {max(prompt_lens)}), output tokens {sum(n for _, n in requests)} "
        f"(mean {sum(n for _, n in requests) / len(requests):.0f}); "
        f"torch threads {torch.get_num_threads()}"
    )

    warmup = requests[:4]
    engine.generate([p for p, _ in warmup], SamplingParams(max_tokens=8, ignore_eos=True))
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    engine_tokens, engine_s = run_engine(engine, requests)
    if profiler:
        profiler.disable()
    engine_tps = engine_tokens / engine_s
    print(
        f"engine:       {engine_tokens} tokens in {engine_s:.1f} s = {engine_tps:.1f} tok/s {load()} "
        f"(bytes/block {engine.bytes_per_block}, {engine.num_blocks} blocks, "
        f"backend {engine.attention_backend})"
    )
    del engine

    hf = load_model(DEFAULT_MODEL, torch.bfloat16).hf_model
    run_transformers(hf, tokenizer, [(p, 8) for p, _ in warmup], len(warmup))
    hf_tokens, hf_s = run_transformers(hf, tokenizer, requests, args.concurrency)
    hf_tps = hf_tokens / hf_s
    print(
        f"transformers: {hf_tokens} tokens in {hf_s:.1f} s = {hf_tps:.1f} tok/s {load()} "
        f"(static batches of {args.concurrency})"
    )
    print(f"ratio engine / transformers = {engine_tps / hf_tps:.2f}x (target >= 1.5x)")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
