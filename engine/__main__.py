"""``python -m engine "a prompt"``: one chat turn through the engine, answer on stdout.

The prompt goes through the model's chat template (the quickest end-to-end proof that the
engine runs a real trained model). Bad settings, and a prompt plus --max-tokens longer than the
engine's max_model_len, print one line and exit with status 2; a request that fails in the engine
(oom) prints what it produced, one line, and exits with status 1.
"""

from __future__ import annotations

import argparse
import sys

from engine.config import DEFAULT_MODEL, EngineConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    p.add_argument("prompt", help="the user message")
    p.add_argument("--model", default=DEFAULT_MODEL, help="SmolLM2-135M-Instruct (default) or a local HF folder")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None, help="sampling seed of the request")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16) | float32 | float16")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--attention-backend", default="auto", help="auto | torch | triton")
    p.add_argument("--no-chat-template", action="store_true", help="send the prompt as plain text")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        from engine.llm_engine import LLMEngine
        from engine.request import SamplingParams

        params = SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
        )
        engine = LLMEngine(
            EngineConfig(
                model=args.model, dtype=args.dtype, device=args.device, attention_backend=args.attention_backend
            )
        )
        tokenizer = engine.tokenizer
        if tokenizer is None:
            raise ValueError(f"model: {engine.model_name} has no tokenizer; pick a model that has one")
        if args.no_chat_template or not tokenizer.chat_template:
            prompt_ids = tokenizer(args.prompt)["input_ids"]
        else:
            messages = [{"role": "user", "content": args.prompt}]
            prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        output = engine.generate([prompt_ids], params)[0]
    except (ValueError, RuntimeError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if output.finish_reason == "cannot_fit":  # the input's fault, and the answer would be empty
        room = engine.max_model_len - len(prompt_ids)
        where, fix = (
            ("--max-tokens", f"use --max-tokens <= {room}")
            if room >= 1
            else ("prompt", f"shorten it below {engine.max_model_len} tokens")
        )
        print(f"error: {where}: {output.finish_detail}; {fix}", file=sys.stderr)
        return 2
    print(output.text)
    if output.finish_reason not in ("stop", "length"):
        print(f"error: request finished with {output.finish_reason}: {output.finish_detail}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
