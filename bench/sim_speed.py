"""How fast the simulator is: the main workload end to end, and a big closed-loop level in steps/s.

1. ``kvplan simulate workloads/chat.yaml --quiet`` in a fresh interpreter, twice (the first run
   may sample and tokenise ShareGPT; later ones read the cached sample): wall seconds, and the
   heavy packages it imported (none of torch, transformers, triton). Target: at most 5 s.
2. One closed-loop level of 256 concurrent requests of 2,048 tokens (1,024 prompt + 1,024
   output) through SimBackend and the load test's driver, timed by the H200 roofline (Llama-3.1-8B:
   the pool holds them all): simulated steps per wall second (target: 1,000 or more).
3. The peer, measured in the same run on a level both can run: 256 concurrent requests of 128 +
   127 tokens (the tiny random model's 256 positions), simulated whole, and on the bundled engine
   itself (tiny-random-llama on this CPU) for its first ``--engine-steps`` steps; the ratio says
   how much faster simulating a step is than running one.

    flock /tmp/kvplan-cpu.lock .venv/bin/python bench/sim_speed.py
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvplan.run.sim.facts import simulated_facts  # noqa: E402
from kvplan.run.sim.gpu_target import gpu_setup  # noqa: E402
from kvplan.run.sim.run import sample  # noqa: E402
from kvplan.run.sim.search import Prober  # noqa: E402
from kvplan.workload.file import parse_workload  # noqa: E402

PROBE = """
import sys, time
start = time.perf_counter()
from kvplan.cli import main
sys.argv = ["kvplan", "simulate", "workloads/chat.yaml", "--quiet", "--out", sys.argv[1]]
try:
    main()
except SystemExit as done:
    assert not done.code
print("HEAVY", sorted(m for m in ("torch", "transformers", "triton") if m in sys.modules))
"""


def level_of(tokens_in: int, tokens_out: int, max_model_len: int) -> dict:
    return {
        "name": "big",
        "seed": 0,
        "dataset": "random",
        "slo": {"ttft_ms": 60000},
        "engine": {
            "model": "tiny-random-llama",
            "dtype": "float32",
            "block_size": 16,
            "max_num_seqs": 256,
            "max_num_batched_tokens": 8192,
            "max_model_len": max_model_len,
            "num_blocks": 4200,
        },
        "buckets": [
            {
                "name": "big",
                "input_tokens": tokens_in,
                "output_tokens": tokens_out,
                "concurrency": [256],
                "num_requests": 256,
            }
        ],
    }


BIG = level_of(1024, 1024, 4096)
PEER = level_of(128, 127, 256)


def chat_wall_seconds() -> None:
    for attempt in ("first", "second"):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", PROBE, f"{tmp}/run"], cwd=ROOT, capture_output=True, text=True)
            seconds = time.perf_counter() - start
        heavy = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else done.stderr.strip()[-300:]
        print(f"kvplan simulate workloads/chat.yaml ({attempt} run): {seconds:.2f} s wall; {heavy}")


def simulated_rate(spec: dict, gpu: str) -> tuple[float, object]:
    """Steps per wall second of the level ``spec`` simulated on ``gpu``'s roofline (Llama-3.1-8B)."""
    workload = parse_workload(spec)
    setup = gpu_setup(workload, "llama-3.1-8b", gpu)
    sampled = sample(workload, setup.facts).requests
    start = time.perf_counter()
    level = Prober(workload, setup.facts, setup.clock, sampled).level(0, "closed", 256)
    return level.num_steps / (time.perf_counter() - start), level


def big_level() -> None:
    rate, level = simulated_rate(BIG, "H200")
    print(
        f"simulated: 256 x (1,024 + 1,024) tokens, closed loop: {level.num_steps:,} steps at {rate:,.0f} steps/s "
        f"({level.num_completed} requests, {level.num_preemptions} preemptions; target 1,000 steps/s)"
    )


def peer(engine_steps: int) -> None:
    rate, level = simulated_rate(PEER, "H200")
    print(f"simulated: 256 x (128 + 127) tokens: {level.num_steps:,} steps at {rate:,.0f} steps/s")

    from engine.request import SamplingParams
    from kvplan.run.bundled.backend import build_engine

    workload = parse_workload(PEER)
    engine = build_engine(workload)
    for i, request in enumerate(sample(workload, simulated_facts(workload, "cpu", "torch")).requests["big"]):
        engine.add_request(
            list(request.prompt_token_ids), SamplingParams(max_tokens=127, ignore_eos=True), request_id=str(i)
        )
    start = time.perf_counter()
    for _ in range(engine_steps):
        engine.step()
    seconds = time.perf_counter() - start
    print(
        f"peer, the engine itself (tiny-random-llama, this CPU): the same level's first {engine_steps} steps at "
        f"{engine_steps / seconds:,.1f} steps/s; simulating a step is {rate / (engine_steps / seconds):,.0f}x "
        "faster than running it"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-steps", type=int, default=40)
    args = parser.parse_args()
    chat_wall_seconds()
    big_level()
    peer(args.engine_steps)


if __name__ == "__main__":
    main()
