"""``kvplan simulate`` of a 20,000-request trace on a GPU target (issue 38 item 4: at most 30 s),
timed in a fresh process; docs/benchmarks.md#trace-20k records the runs.

The trace is bench/profile_scale.py's generated Mooncake-shaped log (the published conversation
trace's lengths, block reuse and arrivals) at 20,000 requests, seed 0, prompt scale 0.2 (some 3 h
of arrivals; the size of an hour of the Azure conversation trace), replayed by this workload::

    engine: SmolLM2-135M-Instruct (the workload's; the target is --model llama-3.1-8b --gpu H100-SXM
      --tp 1), max_model_len 16384, prefix caching on, max_num_seqs 256, max_num_batched_tokens 8192
    dataset: {kind: trace, max_input_tokens: 8192, max_output_tokens: 1024}
    slo: {ttft_ms: 2000, tpot_ms: 50}

and the command ``kvplan simulate W --model llama-3.1-8b --gpu H100-SXM --tp 1 --quiet --out DIR``
runs in a child process: its wall time is measured around it and its peak memory is the child's
``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` (KiB on Linux). The answers (the replay level's
summary, the knee, the SLO capacity) are printed, so two trees can be compared.

    .venv/bin/python bench/sim_trace_20k.py [--requests 20000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from profile_scale import generate, machine  # noqa: E402

WORKLOAD = """name: t20k
seed: 0
engine:
  model: SmolLM2-135M-Instruct
  max_model_len: 16384
  enable_prefix_caching: true
  max_num_seqs: 256
  max_num_batched_tokens: 8192
dataset:
  kind: trace
  path: t20k.jsonl
  max_input_tokens: 8192
  max_output_tokens: 1024
slo: {ttft_ms: 2000, tpot_ms: 50}
buckets:
  - name: hour
"""
TARGET = ["--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--tp", "1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument(
        "--keep", type=Path, default=None, help="write the trace and the run here (else a temp folder, removed after)"
    )
    args = parser.parse_args()
    if args.keep is None:  # the run folder is 2 GB: removed after, unless kept
        with tempfile.TemporaryDirectory(prefix="sim_trace_20k-") as tmp:
            run(Path(tmp), args.requests)
    else:
        args.keep.mkdir(parents=True, exist_ok=True)
        run(args.keep, args.requests)


def run(folder: Path, requests: int) -> None:
    """Write the trace and the workload into ``folder``, simulate them there, print the answers."""
    made = generate(folder / "t20k.jsonl", requests, 0, 0.2)
    (folder / "t20k.yaml").write_text(WORKLOAD)
    run_dir = folder / f"run-{dt.datetime.now():%H%M%S}"
    kvplan = str(Path(sys.executable).parent / "kvplan")
    command = [kvplan, "simulate", str(folder / "t20k.yaml"), *TARGET, "--quiet", "--out", str(run_dir)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if done.returncode != 0:
        sys.exit(f"kvplan simulate failed ({done.returncode}): {done.stderr.strip()}")
    result = json.loads((run_dir / "results.json").read_text())
    (level,) = result["levels"]
    capacity = result["capacity"][0]["buckets"][0]
    print(f"{dt.date.today()}, {machine()}")
    print(f"trace: {made['requests']:,} requests, {made['prompt_tokens']:,} prompt tokens, {made['hours']:.2f} h")
    print(f"stderr: {done.stderr.strip()}")
    print(f"kvplan simulate: {wall:.1f} s wall, peak RSS {peak_mib:,.0f} MiB (ru_maxrss) -- target 30 s")
    summary = {k: level[k] for k in ("num_completed", "num_preemptions", "output_tokens_per_s")}
    print(f"replay level: {summary}, ttft p50 {level['ttft_ms']['p50']:.3f} ms")
    keys = ("knee", "max_concurrency", "max_request_rate")
    answers = {k: (v["level"] if isinstance(v, dict) else v) for k, v in capacity.items() if k in keys}
    print(f"capacity: {answers}")


if __name__ == "__main__":
    main()
