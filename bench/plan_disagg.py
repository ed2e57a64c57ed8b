"""``kvplan plan --disagg`` on a long-prompt workload (8,000 tokens in, 1,000 out; issue 36's target:
a 100-configuration search of xPyD and aggregated candidates within 60 s). Llama-3.1-8B on H100-SXM
and H200: 4 aggregated replicas (tp 1, 2) and 96 disaggregated units (prefill tp 1, 2 x decode tp
1, 2 x 1, 2 prefill workers x 1, 2, 4 decode workers x rdma-400g and nvlink4; --max-gpus 12 so
that every unit is in), max_num_seqs 256 and a 8,192-token budget a worker. The peer, in the same
run: an aggregated-only search of the same size (5 GPU kinds x tp 1, 2, 4, 8 x max_num_seqs 64,
128, 256, 512, 1024 = 100 replicas). Prints both wall times, their ratio, the verdict, the date and
the machine. A configuration's capacity search simulates as many requests as its SLO capacity
carries, so the time grows with the largest units' capacity (4 decode workers x 256 seqs).

``--baseline DIR``: also run the --disagg search on the tree in DIR (a `git archive` of an earlier
commit, imported ahead of this checkout through PYTHONPATH) in the same run, and compare the
answers: the best configuration, and each configuration's SLO capacity (req/s per replica) side
by side, with the largest ratio between the two. ``--no-peer`` skips the aggregated-only peer.

    .venv/bin/python bench/plan_disagg.py               # alone on the machine
    .venv/bin/python bench/plan_disagg.py --requests 10 # a lighter bucket
    git archive 1680933 | tar -x -C /tmp/base
    flock /tmp/kvplan-cpu.lock .venv/bin/python bench/plan_disagg.py --requests 10 --baseline /tmp/base
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
DISAGG: tuple[str, ...] = ("--gpus", "H100-SXM,H200", "--tp", "1,2", "--max-gpus", "12", "--disagg")
DISAGG += ("--prefill-workers", "1,2", "--decode-workers", "1,2,4", "--links", "rdma-400g,nvlink4")
# --heavy: the heaviest part of the grid: H100-SXM replicas tp 1, 2 and its 8 units of 4 decode workers over rdma-400g
HEAVY: tuple[str, ...] = ("--gpus", "H100-SXM", "--tp", "1,2", "--max-gpus", "12", "--disagg")
HEAVY += ("--prefill-workers", "1,2", "--decode-workers", "4", "--links", "rdma-400g")
PEER = ("--gpus", "H100-SXM,H200,B200,A100-80GB,L40S", "--tp", "1,2,4,8", "--max-num-seqs", "64,128,256,512,1024")


def _plan(
    workload: Path, out: Path, jobs: int, rate: float, *grid: str, tree: Path | None = None
) -> tuple[float, dict]:
    """``kvplan plan`` in a child process (on ``tree``'s kvplan where given): its wall time, s, and its JSON."""
    # python -c puts its working folder first on sys.path: the baseline runs in its own tree
    kvplan = [sys.executable, "-c", "import sys; from kvplan.cli import main; sys.argv[0] = 'kvplan'; main()"]
    args = [*kvplan, "plan", str(workload), "--model", "llama-3.1-8b", "--rate", f"{rate:g}", *grid]
    env = dict(os.environ, PYTHONPATH=str(tree)) if tree else dict(os.environ)
    start = time.perf_counter()
    done = subprocess.run(
        [*args, "--jobs", str(jobs), "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tree or ROOT,
        env=env,
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"kvplan plan failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return took, json.loads(done.stdout)


def _key(c: dict) -> tuple:
    return (c["gpu"], c["disagg"] or f"x{c['tp']}", c["max_num_seqs"], c["max_num_batched_tokens"])


def _compare(run: dict, base: dict) -> None:
    """The best configuration of each, and each configuration's SLO capacity side by side."""
    best, before = run["configs"][0], base["configs"][0]
    same = _key(best) == _key(before) and best["replicas"] == before["replicas"]
    print(f"  best: {_key(best)} x{best['replicas']}; baseline {_key(before)} x{before['replicas']}: "
          f"{'the same' if same else 'DIFFERENT'}", flush=True)  # fmt: skip
    old = {_key(c): c for c in base["configs"]}
    worst, equal = 1.0, 0
    for c in run["configs"]:
        b = old[_key(c)]
        new_rate, old_rate = c["slo_max_request_rate"], b["slo_max_request_rate"]
        if new_rate == old_rate:
            equal += 1
        elif new_rate and old_rate:
            worst = max(worst, new_rate / old_rate, old_rate / new_rate)
        else:
            worst = float("inf")
        print(f"    {' '.join(map(str, _key(c)))}: {new_rate} req/s ({old_rate}), {c['replicas']} ({b['replicas']})")
    print(f"  capacities: {equal} of {len(run['configs'])} equal, the largest ratio {worst:.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--requests", type=int, default=20, help="the bucket's sampled requests")
    parser.add_argument("--rate", type=float, default=10.0, help="the load, requests/s")
    parser.add_argument("--baseline", type=Path, help="an earlier tree (git archive) to time beside this one")
    parser.add_argument("--no-peer", action="store_true", help="skip the aggregated-only peer")
    parser.add_argument("--heavy", action="store_true", help="only the heaviest 10 configurations (HEAVY; no peer)")
    args = parser.parse_args()
    grid = HEAVY if args.heavy else DISAGG
    print(
        f"kvplan plan --disagg, 8,000 in / 1,000 out ({dt.date.today()}, {machine()}, --jobs {args.jobs})", flush=True
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        workload = folder / "long.yaml"
        workload.write_text(WORKLOAD.format(requests=args.requests))
        took, run = _plan(workload, folder / "d", args.jobs, args.rate, *grid)
        units = sum(1 for c in run["configs"] if c["disagg"])
        print(f"  --disagg: {run['num_configs']} configurations ({units} xPyD), {took:.1f} s (target 60 s)", flush=True)
        for c in run["configs"][:3]:
            shape = c["disagg"] or f"x{c['tp']}"
            print(
                f"    {c['gpu']} {shape}: {c['replicas']} replica(s), {c['num_gpus']} GPUs, ${c['usd_per_hour']}/h",
                flush=True,
            )
        print(f"  {run['disagg_verdict']}", flush=True)
        if args.baseline:
            then, base = _plan(workload, folder / "b", args.jobs, args.rate, *grid, tree=args.baseline)
            print(f"  baseline {args.baseline}: {then:.1f} s; this / baseline = {took / then:.3f}", flush=True)
            _compare(run, base)
        if args.no_peer or args.heavy:
            return
        peer, other = _plan(workload, folder / "a", args.jobs, args.rate, *PEER)
    size = other["num_configs"]
    print(
        f"  peer, aggregated only: {size} configurations, {peer:.1f} s; disagg / peer = {took / peer:.2f}", flush=True
    )


if __name__ == "__main__":
    main()
