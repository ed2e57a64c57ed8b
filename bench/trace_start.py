"""How long a trace replay takes to start on a million-line trace (issue 38 item 2: "trace replay
of a file that large starts in seconds"): the work before a replay's level sends its first request
(read and check the trace with the workload, then the bucket's requests), timed in a fresh child
process with its peak memory (``ru_maxrss``, KiB on Linux). Prompts are not built up front (a
``TracePrompt`` is drawn when its request is sent), so what is left is reading the lines.

The trace is bench/profile_scale.py's generated Mooncake-shaped log (the published conversation
trace's lengths, block reuse and arrivals) at full prompt scale, seed 0.

    .venv/bin/python bench/trace_start.py [--requests 1000000] [--peer DIR]

``--peer DIR``: also time the same in a source tree at DIR (``git archive`` of another commit),
in the same run, on the same file (a tree that builds every prompt up front needs memory for
every prompt token: give it a smaller ``--requests``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from profile_scale import generate, machine  # noqa: E402

WORKLOAD = """name: start
engine: {model: SmolLM2-135M-Instruct, max_model_len: 16384, enable_prefix_caching: true}
dataset: {kind: trace, path: t.jsonl, max_input_tokens: 8192, max_output_tokens: 1024}
buckets: [{name: trace}]
"""
CHILD = """
import sys, time
start = time.perf_counter()
from kvplan.workload.file import load_workload
from kvplan.traffic.trace import sample_trace
workload = load_workload(sys.argv[1])
read = time.perf_counter()
requests = sample_trace(workload, 49152).requests["trace"]
first = tuple(requests[0].prompt_token_ids)
done = time.perf_counter()
print(f"{len(requests)} {read - start:.2f} {done - read:.2f} {done - start:.2f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--peer", type=Path, default=None, help="a source tree to time the same in")
    args = parser.parse_args()
    print(f"{dt.date.today()}, {machine()}")
    with tempfile.TemporaryDirectory(prefix="trace_start-") as tmp:
        folder = Path(tmp)
        made = generate(folder / "t.jsonl", args.requests, 0, 1.0)
        (folder / "w.yaml").write_text(WORKLOAD)
        size_mb = (folder / "t.jsonl").stat().st_size / 1e6
        print(f"trace: {made['requests']:,} lines, {size_mb:,.0f} MB, {made['prompt_tokens']:,} prompt tokens")
        for name, tree in (("this tree", ROOT), *((("peer", args.peer),) if args.peer else ())):
            env = {**os.environ, "PYTHONPATH": str(tree)}
            run = [sys.executable, "-c", CHILD, str(folder / "w.yaml")]
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            out = subprocess.run(run, capture_output=True, text=True, cwd=tree, env=env, check=True).stdout.split()
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child's so far
            n, read_s, requests_s, total_s = int(out[0]), *map(float, out[1:])
            memory = f"{peak / 1024:,.0f} MiB" if peak > before else f"<= {before / 1024:,.0f} MiB"
            print(
                f"{name}: read and checked {read_s:.2f} s + {n:,} requests {requests_s:.2f} s = {total_s:.2f} s"
                f" to the first request's prompt; peak RSS {memory} (ru_maxrss, Python and imports included)"
            )


if __name__ == "__main__":
    main()
