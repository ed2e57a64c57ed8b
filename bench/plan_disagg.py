"""``kvplan plan --disagg`` on a long-prompt workload (8,000 tokens in, 1,000 out; issue 36's target:
a 100-configuration search of xPyD and aggregated candidates within 60 s). Llama-3.1-8B on H100-SXM
and H200: 4 aggregated replicas (tp 1, 2) and 96 disaggregated units (prefill tp 1, 2 x decode tp
1, 2 x 1, 2 prefill workers x 1, 2, 4 decode workers x rdma-400g and nvlink4; --max-gpus 12 so
that every unit is in), max_num_seqs 256 and a 8,192-token budget a worker. The peer, in the same
run: an aggregated-only search of the same size (5 GPU kinds x tp 1, 2, 4, 8 x max_num_seqs 64,
128, 256, 512, 1024 = 100 replicas). Prints both wall times, their ratio, the verdict, the date and
the machine. A configuration's capacity search simulates as many requests as its SLO capacity
carries, so the time grows with the largest units' capacity (4 decode workers x 256 seqs).

    .venv/bin/python bench/plan_disagg.py               # alone on the machine
    .venv/bin/python bench/plan_disagg.py --requests 10 # a lighter bucket
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from profile_scale import machine  # noqa: E402

WORKLOAD = """name: long-prompts
seed: 0
engine: {{model: SmolLM2-135M-Instruct, max_model_len: 16384, enable_prefix_caching: false}}
dataset: random
slo: {{ttft_ms: 2000, tpot_ms: 30}}
buckets:
  - {{name: long, input_tokens: 8000, output_tokens: 1000, concurrency: [4], num_requests: {requests}}}
"""
DISAGG = ("--gpus", "H100-SXM,H200", "--tp", "1,2", "--max-gpus", "12", "--disagg", "--prefill-workers", "1,2")
DISAGG += ("--decode-workers", "1,2,4", "--links", "rdma-400g,nvlink4")
PEER = ("--gpus", "H100-SXM,H200,B200,A100-80GB,L40S", "--tp", "1,2,4,8", "--max-num-seqs", "64,128,256,512,1024")


def _plan(workload: Path, out: Path, jobs: int, rate: float, *grid: str) -> tuple[float, dict]:
    """``kvplan plan`` in a child process: its wall time, s, and its JSON."""
    kvplan = str(Path(sys.executable).with_name("kvplan"))
    args = [kvplan, "plan", str(workload), "--model", "llama-3.1-8b", "--rate", f"{rate:g}", *grid]
    start = time.perf_counter()
    done = subprocess.run(
        [*args, "--jobs", str(jobs), "--out", str(out), "--json"], capture_output=True, text=True, check=False
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"kvplan plan failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return took, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--requests", type=int, default=20, help="the bucket's sampled requests")
    parser.add_argument("--rate", type=float, default=10.0, help="the load, requests/s")
    args = parser.parse_args()
    print(
        f"kvplan plan --disagg, 8,000 in / 1,000 out ({dt.date.today()}, {machine()}, --jobs {args.jobs})", flush=True
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        workload = folder / "long.yaml"
        workload.write_text(WORKLOAD.format(requests=args.requests))
        took, run = _plan(workload, folder / "d", args.jobs, args.rate, *DISAGG)
        units = sum(1 for c in run["configs"] if c["disagg"])
        print(f"  --disagg: {run['num_configs']} configurations ({units} xPyD), {took:.1f} s (target 60 s)", flush=True)
        for c in run["configs"][:3]:
            shape = c["disagg"] or f"x{c['tp']}"
            print(
                f"    {c['gpu']} {shape}: {c['replicas']} replica(s), {c['num_gpus']} GPUs, ${c['usd_per_hour']}/h",
                flush=True,
            )
        print(f"  {run['disagg_verdict']}", flush=True)
        peer, other = _plan(workload, folder / "a", args.jobs, args.rate, *PEER)
    size = other["num_configs"]
    print(
        f"  peer, aggregated only: {size} configurations, {peer:.1f} s; disagg / peer = {took / peer:.2f}", flush=True
    )


if __name__ == "__main__":
    main()
