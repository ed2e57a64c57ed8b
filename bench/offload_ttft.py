"""TTFT of a prompt that comes back after its KV was evicted, on the bundled engine: recomputed
(no offload) against loaded back from the host tier (engine.offload), SmolLM2-135M on this machine.

A pool of 48 blocks of 16 tokens; request A (513 tokens), then B (600 tokens, evicting A's cached
blocks, 22 of them to the host tier when it is on), then A again, each alone with max_tokens 1.
Per engine (no offload, then a 1 GiB host tier) it prints each request's time from add to finish
(its TTFT: one token), the prompt tokens computed, the host blocks loaded and stored, and the bytes
loaded. Run twice; the first requests of each engine pay one-time start-up costs.

    .venv/bin/python bench/offload_ttft.py [--host-gib 1.0]
"""

from __future__ import annotations

import argparse
import random
import time

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.request import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-gib", type=float, default=1.0)
    args = parser.parse_args()
    rng = random.Random(3)
    a, b = ([rng.randrange(3, 49152) for _ in range(n)] for n in (513, 600))
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    for host in (None, args.host_gib):
        engine = LLMEngine(EngineConfig(num_blocks=48, max_num_batched_tokens=1024, offload_host_gib=host))
        for i, prompt in enumerate((a, b, a)):
            start = time.perf_counter()
            engine.add_request(prompt, params, request_id=str(i))
            steps = []
            while engine.has_unfinished():
                steps.append(engine.step()[1])
            print(
                f"host_gib={host} request {'ABA'[i]}: {(time.perf_counter() - start) * 1e3:.0f} ms,"
                f" prompt tokens computed {sum(s.num_prefill_tokens for s in steps)},"
                f" host loads {sum(s.num_host_loads for s in steps)}, stores {sum(s.num_host_stores for s in steps)},"
                f" bytes loaded {sum(s.offload_bytes_loaded for s in steps):,}"
            )


if __name__ == "__main__":
    main()
