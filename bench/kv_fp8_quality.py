"""What an fp8 (e4m3) KV cache costs in quality: our engine with fp8 KV against the same bf16 model
with bf16 KV, same run, same prompts (kvplan.run.bundled.fp8_quality has the definitions).

Prompts: the first ``--num-prompts`` ShareGPT conversations (file order) whose first human turn,
in SmolLM2's chat template, is at most ``--max-prompt-tokens`` tokens and whose real reply has at
least ``--num-tokens`` tokens. The next ``--num-calibration-prompts`` such conversations calibrate
the fp8 scales (amax / 448 per layer), so no measured prompt is a calibration prompt.

Prints: greedy agreement over the first ``--num-tokens`` generated tokens (mean fraction of
positions that agree up to the first divergence; fraction of prompts matching exactly) and the
mean KL(p_bf16 || p_fp8) over the teacher-forced reply positions, and the wall time.

    .venv/bin/python bench/kv_fp8_quality.py [--num-prompts 50] [--num-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from engine.config import DEFAULT_MODEL, EngineConfig
from engine.models.loader import load_model
from kvplan.run.bundled.fp8_quality import run_fp8_quality, sharegpt_quality_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--num-prompts", type=int, default=50)
    parser.add_argument("--num-tokens", type=int, default=64)
    parser.add_argument("--num-calibration-prompts", type=int, default=8)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()

    start = time.perf_counter()
    tokenizer = load_model(args.model, torch.bfloat16).tokenizer
    prompts = sharegpt_quality_prompts(
        tokenizer, args.num_prompts + args.num_calibration_prompts, args.num_tokens, args.max_prompt_tokens
    )
    measured, calibration = prompts[: args.num_prompts], prompts[args.num_prompts :]
    print(
        f"{len(measured)} ShareGPT prompts ({sum(len(p.prompt_token_ids) for p in measured):,} prompt tokens),"
        f" {len(calibration)} calibration prompts; prepared in {time.perf_counter() - start:.1f} s"
    )
    config = EngineConfig(model=args.model, dtype="bfloat16", max_num_seqs=args.max_num_seqs)
    quality = run_fp8_quality(
        config,
        measured,
        [list(p.prompt_token_ids) for p in calibration],
        args.num_tokens,
        "ShareGPT: first human turn (chat template) + its real reply",
    )
    t = quality.num_tokens
    print(f"model {quality.model}, weights {quality.dtype}; fp8 (e4m3) KV against {quality.dtype} KV")
    print(
        f"greedy, first {t} tokens: prefix agreement {quality.prefix_agreement:.3f}"
        f" (mean first divergence {quality.mean_first_divergence:.1f} of {t}),"
        f" exact {t}-token matches {quality.exact_match_rate:.3f}"
    )
    print(
        f"teacher-forced, {quality.num_kl_positions} reply positions: mean KL(p_bf16 || p_fp8)"
        f" {quality.mean_kl:.2e} nats (max {quality.max_kl:.2e}), top-1 agreement {quality.top1_agreement:.3f}"
    )
    print(f"check {quality.seconds:.1f} s, total {time.perf_counter() - start:.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(quality.to_dict(), f, indent=2)


if __name__ == "__main__":
    main()
