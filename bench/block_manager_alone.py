"""The block manager alone on the long-output case's block traffic (docs/benchmarks.md#issue-35).

64 requests of 1,024 random prompt tokens and 8,192 simulated output tokens (engine.decode_run's
SIMULATED_TOKEN_ID) decode in stretches of 112 steps: each stretch takes the blocks the requests
grow into (``append_blocks``, in one call), offers their filled blocks to the prefix cache
(``cache_computed_blocks``) and frees each finished request (``free``), admitting a new one in
its place (``find_cached_prefix`` then ``allocate``), until ``--requests`` have finished. Block
size 16, a pool of ``--blocks``; ``--defer``: with deferred block hashes
(``BlockManager.defer_hashes``, on in every simulation: the random prompts' blocks are entered in
the cache unhashed). Prints the seconds and the pool's end state (evictions, free and used blocks,
the free queue's head), which must be equal on any two trees. Times the engine it imports: put a
tree first on PYTHONPATH (e.g. a ``git archive`` of main beside your worktree).

    PYTHONPATH=TREE .venv/bin/python bench/block_manager_alone.py --blocks 400000 --requests 800
"""

from __future__ import annotations

import argparse
import random
import time

from engine.block_manager import BlockManager
from engine.request import Request, SamplingParams

PROMPT, OUTPUT, USERS, STRETCH, BLOCK = 1024, 8192, 64, 112, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=400_000, help="blocks in the pool")
    parser.add_argument("--requests", type=int, default=800, help="finished requests to stop at")
    parser.add_argument("--defer", action="store_true", help="defer block hashes, as the simulator does")
    args = parser.parse_args()
    rng = random.Random(0)
    bm = BlockManager(args.blocks, BLOCK, True)
    if args.defer:
        bm.defer_hashes()
    made = 0
    prompts = [tuple(rng.randrange(32000) for _ in range(PROMPT)) for _ in range(args.requests + 2 * USERS)]

    def admit() -> Request:  # the prompts are drawn before the clock starts
        nonlocal made
        request = Request(f"r{made}", prompts[made], SamplingParams(max_tokens=OUTPUT), 0.0)
        made += 1
        assert bm.allocate(request.request_id, PROMPT + 1, bm.find_cached_prefix(request))
        request.num_computed_tokens = PROMPT  # the prefill sampled one token
        request.output_token_ids.append(-1)
        bm.cache_computed_blocks(request)
        return request

    start = time.perf_counter()
    live = [admit() for _ in range(USERS)]
    finished = 0
    while finished < args.requests:
        names: list[str] = []
        for r in live:
            r.output_token_ids.extend([-1] * STRETCH)
            r.num_computed_tokens += STRETCH
            names += [r.request_id] * (bm.num_blocks_for(r.num_computed_tokens + 1) - len(bm.block_table(r.request_id)))
        assert bm.append_blocks(names)
        for r in live:
            bm.cache_computed_blocks(r)
        for i, r in enumerate(live):
            if r.num_computed_tokens >= PROMPT + OUTPUT:
                bm.free(r.request_id)
                finished += 1
                live[i] = admit()
    seconds = time.perf_counter() - start
    print(
        f"{seconds:.2f} s; evictions {bm.num_evictions}, free blocks {bm.num_free_blocks}, "
        f"used blocks {bm.num_used_blocks}, free queue's first ids {bm.free_queue()[:3]}"
    )


if __name__ == "__main__":
    main()
