"""The simulator at production scale, against the code before the change (the peer), same run.

Three timings and a rate, each in a fresh interpreter, first on this tree and then on an older
commit of kvplan (``--peer``, default ``d51b078``: main before steady-state levels and the bounded
searches), exported with ``git archive`` into a temporary folder:

1. ``burst``: a burst of 5,000 ShareGPT-shaped requests (input lognormal mean 233 / std 250,
   output 221 / 200, both clipped to [4, 1024], as bench/public_cases.py reads the public records)
   against Llama-3.1-8B on one A100-80GB, max_num_seqs 256, max_num_batched_tokens 8192: the level
   alone (target: at most 5 s), then the whole ``kvplan simulate`` of it, knee and SLO search
   included (target: at most 30 s).
2. ``wide``: 10,000 requests with 2,000 in flight (max_num_seqs 2048) against Llama-3.1-8B on an
   H200 with an fp8 KV cache (a pool that holds them): the level alone (target: at most 10 s).
3. ``rate``: request-steps per second (requests scheduled, summed over steps) of one closed-loop
   level of 256 in flight (1,024 + 1,024 tokens, Llama-3.1-8B on an H200): the target is
   2,000,000, about ten times the rate measured on 2026-11-30.

4. ``--public``: ``kvplan simulate`` (knee and SLO search included) of each of the 13 public
   serving records (tests/kvplan/data/public_serving_benchmarks.yaml, read by bench/public_cases.py)
   at its own published load, on this tree only (target: at most 60 s each).

5. ``--offload GIB`` (2026-12-05, issue 37): the burst on this tree with KV offload tiers off, with
   prefix caching on and no tier, and with a host tier of GIB GiB (offload needs prefix caching):
   the level alone and the whole ``kvplan simulate`` (target: the host tier at most 1.5x tiers off).

A run that does not finish within ``--timeout`` seconds prints as ``> timeout``.

    .venv/bin/python bench/sim_scale.py            # alone on the machine; run it twice
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAREGPT = {
    "input_tokens": {"min": 4, "max": 1024, "dist": "lognormal", "mean": 233, "std": 250},
    "output_tokens": {"min": 4, "max": 1024, "dist": "lognormal", "mean": 221, "std": 200},
}


def workload(name: str, concurrency: int, requests: int, max_num_seqs: int, lengths: dict) -> dict:
    return {
        "name": name,
        "seed": 0,
        "dataset": "random",
        "slo": {"ttft_ms": 2000, "tpot_ms": 100},
        "engine": {
            "model": "tiny-random-llama",
            "block_size": 16,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": 8192,
            "max_model_len": 2048,
            "enable_prefix_caching": False,
        },
        "buckets": [{"name": "b", **lengths, "concurrency": [concurrency], "num_requests": requests}],
    }


LEVEL = """
import json, sys, time
from kvplan.run.sim.cli_setup import setups_for
from kvplan.run.sim.run import sample
from kvplan.run.sim.search import Prober
from kvplan.workload.file import load_workload
path, model, gpu, kv = sys.argv[1:5]
w = load_workload(path)
setup = setups_for(w, calibrate=None, model=model, gpu=gpu, tp=1, kv_cache_dtype=kv, weight_dtype="auto",
                   gpu_memory_utilization=None, replay=None, attainment=0.95)[0]
sampled = sample(w, setup.facts).requests
prober = Prober(w, setup.facts, setup.clock, sampled)
steps = []
import kvplan.run.sim.search as search
real = search._Records.record
def record(self, finished, stats):
    steps.extend(stats)
    real(self, finished, stats)
search._Records.record = record
start = time.perf_counter()
summary = prober.level(0, "closed", w.buckets[0].concurrency[0])
wall = time.perf_counter() - start
request_steps = sum(s.num_running + s.num_finished for s in steps)
tiers = {k: sum(getattr(s, k, 0) for s in steps) for k in ("num_host_stores", "num_host_loads")}
print(json.dumps({"wall_s": wall, "steps": len(steps), "request_steps": request_steps,
                  "preemptions": summary.num_preemptions, "completed": summary.num_completed, **tiers}))
"""


def run(tree: Path, args: list[str], timeout: float) -> tuple[float | None, str]:
    """(wall seconds, stdout) of ``python args`` with ``tree`` first on the path; None past ``timeout``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, ""
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start, done.stdout


def measure(tree: Path, files: dict[str, Path], timeout: float) -> dict:
    out: dict = {}
    for name, model, gpu, kv in (("burst", "llama-3.1-8b", "A100-80GB", "auto"),
                                 ("wide", "llama-3.1-8b", "H200", "fp8"),
                                 ("rate", "llama-3.1-8b", "H200", "auto")):  # fmt: skip
        wall, text = run(tree, ["-c", LEVEL, str(files[name]), model, gpu, kv], timeout)
        out[name] = json.loads(text) if wall is not None else None
    cli = "import sys; from kvplan.cli import main; sys.argv = ['kvplan', *sys.argv[1:]]; main()"
    sim_out = Path(tempfile.mkdtemp()) / "sim"
    simulate = ["simulate", str(files["burst"]), "--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--quiet",
                "--out", str(sim_out)]  # fmt: skip
    out["simulate_s"] = run(tree, ["-c", cli, *simulate], timeout)[0]
    return out


def seconds(value: float | None, timeout: float) -> str:
    return f"> {timeout:.0f} s" if value is None else f"{value:.2f} s"


def public(timeout: float) -> None:
    """Each public record simulated whole with the CLI, in a fresh interpreter: wall seconds."""
    sys.path.insert(0, str(ROOT))
    from bench.public_cases import load_cases

    cli = "import sys; from kvplan.cli import main; sys.argv = ['kvplan', *sys.argv[1:]]; main()"
    folder = Path(tempfile.mkdtemp(prefix="kvplan-public-"))
    worst = 0.0
    for case in load_cases():
        path = folder / f"{case.id[:60]}.yaml"
        path.write_text(json.dumps(case.workload.model_dump(mode="json")))
        args = ["simulate", str(path), "--model", case.model, "--gpu", case.gpu, "--tp", str(case.tp), "--quiet",
                "--out", str(folder / f"{case.id[:60]}-run")]  # fmt: skip
        if case.utilization is not None:
            args += ["--gpu-memory-utilization", str(case.utilization)]
        wall = run(ROOT, ["-c", cli, *args], timeout)[0]
        worst = max(worst, wall if wall is not None else float("inf"))
        print(f"  {case.id[:70]:70s} {seconds(wall, timeout):>9s}")
    print(f"public records: slowest {seconds(worst if worst != float('inf') else None, timeout)} (target <= 60 s)")


def offload(timeout: float, host_gib: float) -> None:
    """The burst of 5,000 (Llama-3.1-8B on one A100-80GB) on this tree: tiers off (the burst as
    above: prefix caching off), prefix caching on without a tier, and a host tier of ``host_gib``
    GiB (prefix caching on, as offload needs): the level alone and the whole ``kvplan simulate``
    (target: the host tier at most 1.5x the tiers-off time)."""
    folder = Path(tempfile.mkdtemp(prefix="kvplan-offload-"))
    base = workload("burst", 5000, 5000, 256, SHAREGPT)
    cached = {**base, "engine": {**base["engine"], "enable_prefix_caching": True}}
    tiered = {**cached, "engine": {**cached["engine"], "offload": {"host_gib": host_gib}}}
    cli = "import sys; from kvplan.cli import main; sys.argv = ['kvplan', *sys.argv[1:]]; main()"
    rows = []
    cases = (("tiers off", base), ("prefix caching, no tier", cached), (f"host tier {host_gib:g} GiB", tiered))
    for label, spec in cases:
        path = folder / f"{len(rows)}.yaml"
        path.write_text(json.dumps(spec))
        wall, text = run(ROOT, ["-c", LEVEL, str(path), "llama-3.1-8b", "A100-80GB", "auto"], timeout)
        level = json.loads(text) if wall is not None else None
        args = ["simulate", str(path), "--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--quiet",
                "--out", str(folder / f"{len(rows)}-run")]  # fmt: skip
        whole = run(ROOT, ["-c", cli, *args], timeout)[0]
        rows.append((label, level, whole))
    off_level, off_whole = rows[0][1] and rows[0][1]["wall_s"], rows[0][2]
    for label, level, whole in rows:
        wall = level and level["wall_s"]
        ratio = f"{wall / off_level:.2f}x" if wall and off_level else "n/a"
        whole_ratio = f"{whole / off_whole:.2f}x" if whole and off_whole else "n/a"
        tiers = f", {level['num_host_stores']:,} host stores, {level['num_host_loads']:,} loads" if level else ""
        print(f"burst of 5,000, {label:26s} level {seconds(wall, timeout):>9s} ({ratio})  kvplan simulate"
              f" {seconds(whole, timeout):>9s} ({whole_ratio}){tiers}")  # fmt: skip
    print("target: the host tier at most 1.5x tiers off")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", default="d51b078", help="the older commit to measure beside this tree")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a run counts as not finished")
    parser.add_argument("--public", action="store_true", help="time kvplan simulate on the 13 public records")
    parser.add_argument("--offload", type=float, metavar="GIB", help="time the burst with a host tier of GIB GiB")
    args = parser.parse_args()
    if args.offload is not None:
        offload(args.timeout, args.offload)
        return
    if args.public:
        public(args.timeout)
        return
    folder = Path(tempfile.mkdtemp(prefix="kvplan-scale-"))
    files = {
        "burst": workload("burst", 5000, 5000, 256, SHAREGPT),
        "wide": workload("wide", 2000, 10000, 2048, SHAREGPT),
        "rate": workload("rate", 256, 256, 256, {"input_tokens": 1024, "output_tokens": 1024}),
    }
    paths = {}
    for name, spec in files.items():
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(json.dumps(spec))
    peer = folder / "peer"
    peer.mkdir()
    archive = subprocess.run(["git", "archive", args.peer], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(peer, filter="data")
    print(f"bench/sim_scale.py, {dt.date.today()}, {platform.node()} ({platform.processor() or platform.machine()},"
          f" {os.cpu_count()} CPUs), Python {platform.python_version()}")  # fmt: skip
    ours, theirs = measure(ROOT, paths, args.timeout), measure(peer, paths, args.timeout)
    for label, key, target in (("burst of 5,000, the level", "burst", 5), ("10,000 with 2,000 in flight", "wide", 10)):
        a, b = ours[key], theirs[key]
        print(f"{label:32s} this tree {seconds(a and a['wall_s'], args.timeout):>9s}  peer {args.peer}"
              f" {seconds(b and b['wall_s'], args.timeout):>9s}  (target <= {target} s)")  # fmt: skip
    print(f"{'burst of 5,000, kvplan simulate':32s} this tree {seconds(ours['simulate_s'], args.timeout):>9s}  peer"
          f" {args.peer} {seconds(theirs['simulate_s'], args.timeout):>9s}  (target <= 30 s)")  # fmt: skip
    rates = [r and r["request_steps"] / r["wall_s"] for r in (ours["rate"], theirs["rate"])]
    ratio = f"{rates[0] / rates[1]:.2f}x" if all(rates) else "n/a"
    print(f"{'256 in flight, request-steps/s':32s} this tree {rates[0] or 0:>11,.0f}  peer {rates[1] or 0:>11,.0f}"
          f"  ratio {ratio} (target >= 2,000,000)")  # fmt: skip


if __name__ == "__main__":
    main()
