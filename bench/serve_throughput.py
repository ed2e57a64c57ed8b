"""Output tokens/s of ``python -m engine.serve`` against ``transformers serve --continuous-batching``
and against the in-process engine, same run, same machine, same client.

Workload (../shared/ENVIRONMENT.md's measurement of transformers serve): the first 64 ShareGPT first
turns that pass bench/engine_throughput.py's filter, chat-templated by SmolLM2's tokenizer and sent as
that text to ``/v1/completions``; ``max_tokens`` 128, greedy (temperature 0, EOS allowed: transformers
serve has no ignore_eos), 32 streams in flight (closed loop), bf16, 2912 KV blocks of 16 tokens on
both servers. The client is kvplan's own (kvplan.run.server.backend, one event loop); output tokens
are each server's usage counts. The in-process engine runs the same requests with ``max_num_seqs`` 32,
all queued at once (32 in flight). Servers run one at a time, as subprocesses. Prints each side's
tokens/s and the ratios (targets: engine.serve >= 2.5x transformers serve; engine.serve within 15%
of the in-process engine).

    .venv/bin/python bench/serve_throughput.py [--num-prompts 64] [--concurrency 32] [--skip-transformers]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
NUM_BLOCKS, BLOCK_SIZE, MAX_TOKENS = 2912, 16, 128


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> str:
    """The first model id once ``url``/models answers."""
    from kvplan.run.server.preflight import get

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            status, body = get(f"{url}/models", None, 2.0)
            if status == 200:
                return json.loads(body)["data"][0]["id"]
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not come up in {timeout_s} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drive(url: str, model: str, requests, decode, concurrency: int) -> tuple[int, float, int]:
    """Closed loop of ``concurrency`` streams; (output tokens, seconds, failed requests)."""
    from kvplan.run.driver import Submission
    from kvplan.run.server.backend import BodySpec, HttpBackend

    spec = BodySpec(url, "completions", model, exact=False, salt=False, extra_body={}, decode=decode)
    backend = HttpBackend(spec, {}, 900.0, 1, None)
    pending, in_flight, done = list(enumerate(requests)), 0, []
    start = time.perf_counter()
    try:
        while pending or in_flight:
            while pending and in_flight < concurrency:
                i, ids = pending.pop(0)
                backend.submit(Submission(f"r{i}", tuple(ids), MAX_TOKENS, 0, "", None))
                in_flight += 1
            finished, _ = backend.advance(None)
            done += finished
            in_flight -= len(finished)
    finally:
        backend.close()
    elapsed = time.perf_counter() - start
    ok = [f for f in done if f.finish_reason in ("stop", "length")]
    return sum(f.num_output_tokens for f in ok), elapsed, len(done) - len(ok)


def serve(cmd: list[str], url: str, requests, decode, concurrency: int, name: str) -> float:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        model = wait_ready(url, proc)
        drive(url, model, requests[:4], decode, 4)  # warm-up: weights paged in, first-request costs paid
        tokens, seconds, failed = drive(url, model, requests, decode, concurrency)
    finally:
        proc.terminate()
        proc.wait(30)
    tps = tokens / seconds
    print(
        f"{name:<20} {tokens} tokens in {seconds:.1f} s = {tps:.1f} tok/s ({failed} failed)"
        f" [load {os.getloadavg()[0]:.1f}]",
        flush=True,
    )
    return tps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()

    from engine_throughput import sample_requests

    from engine.config import DEFAULT_MODEL, EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.models.loader import smollm2_folder
    from engine.request import SamplingParams

    engine = LLMEngine(
        EngineConfig(
            model=DEFAULT_MODEL,
            dtype="bfloat16",
            max_num_seqs=args.concurrency,
            block_size=BLOCK_SIZE,
            num_blocks=NUM_BLOCKS,
        )
    )
    tokenizer = engine.tokenizer
    requests = [ids for ids, _ in sample_requests(tokenizer, args.num_prompts, MAX_TOKENS)]
    decode = lambda ids: tokenizer.decode(list(ids))  # noqa: E731  the chat-templated text, special tokens kept
    print(
        f"{len(requests)} ShareGPT first turns, prompt tokens mean {sum(map(len, requests)) / len(requests):.0f},"
        f" max_tokens {MAX_TOKENS}, {args.concurrency} streams, {NUM_BLOCKS} blocks of {BLOCK_SIZE}"
    )
    params = SamplingParams(max_tokens=MAX_TOKENS)
    engine.generate(requests[:4], SamplingParams(max_tokens=8))
    start = time.perf_counter()
    outputs = engine.generate(requests, params)
    seconds = time.perf_counter() - start
    inproc = sum(len(o.output_token_ids) for o in outputs) / seconds
    print(
        f"{'in-process engine':<20} {sum(len(o.output_token_ids) for o in outputs)} tokens in {seconds:.1f} s"
        f" = {inproc:.1f} tok/s [load {os.getloadavg()[0]:.1f}]",
        flush=True,
    )
    del engine

    port = free_port()
    ours = serve(
        [
            sys.executable,
            "-m",
            "engine.serve",
            "--model",
            DEFAULT_MODEL,
            "--dtype",
            "bfloat16",
            "--block-size",
            str(BLOCK_SIZE),
            "--num-gpu-blocks-override",
            str(NUM_BLOCKS),
            "--max-num-seqs",
            str(args.concurrency),
            "--port",
            str(port),
        ],
        f"http://127.0.0.1:{port}/v1",
        requests,
        decode,
        args.concurrency,
        "engine.serve",
    )
    print(f"engine.serve / in-process: {ours / inproc:.2f} (target >= 0.85)")
    if args.skip_transformers:
        return
    port = free_port()
    theirs = serve(
        [
            str(Path(sys.executable).parent / "transformers"),
            "serve",
            str(smollm2_folder()),
            "--continuous-batching",
            "--cb-block-size",
            str(BLOCK_SIZE),
            "--cb-num-blocks",
            str(NUM_BLOCKS),
            "--dtype",
            "bfloat16",
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "error",
        ],
        f"http://127.0.0.1:{port}/v1",
        requests,
        decode,
        args.concurrency,
        "transformers serve",
    )
    print(f"engine.serve / transformers serve: {ours / theirs:.2f} (target >= 2.5)")


if __name__ == "__main__":
    main()
