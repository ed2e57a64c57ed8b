"""Issue 35's timings: `kvplan simulate` on the workloads it names, this tree beside an earlier one.

Each case runs `kvplan simulate ... --quiet` in a fresh interpreter (wall seconds, imports and
setup included) and prints its answers (knees, max concurrency and max request rate per target
and bucket, read from results.json), so a faster run is seen to give the same answers:

1. ``workloads/chat.yaml``: the main workload (the engine section and its four plan: entries).
2. ``long-out``: Llama-3.1-70B on B200 x8, one closed level of 4 users, 32 requests of 1,024 in /
   8,192 out (random prompts, prefix caching on, max_model_len 16,384), SLO TTFT 600 s and TPOT
   10 s, so the capacity search runs past max_num_seqs and through the rate search.
3. ``moe``: DeepSeek-V3 on B200 x8, 16 users, 32 requests of 8,192 in / 1,024 out, the same SLO.

``--baseline DIR``: also run each case on the tree in DIR (a `git archive` of an earlier commit,
imported ahead of this checkout through PYTHONPATH), case by case in the same run. Measure alone:

    git archive 0bab52f | tar -x -C /tmp/base
    flock /tmp/kvplan-cpu.lock .venv/bin/python bench/sim_long_outputs.py --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLO = "slo: {ttft_ms: 600000, tpot_ms: 10000}"
LEVEL = """name: {name}
seed: 0
dataset: random
{slo}
engine:
  max_model_len: 16384
buckets:
  - name: {name}
    input_tokens: {tokens_in}
    output_tokens: {tokens_out}
    concurrency: [{users}]
    num_requests: 32
"""
CASES = {
    "chat": ("workloads/chat.yaml", []),
    "long-out": (("long-out", 1024, 8192, 4), ["--model", "llama-3.1-70b", "--gpu", "B200", "--tp", "8"]),
    "moe": (("moe", 8192, 1024, 16), ["--model", "deepseek-v3", "--gpu", "B200", "--tp", "8"]),
}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{platform.node()}, {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def answers(run_dir: Path) -> list[str]:
    """One line per target and bucket: knee, max concurrency (bound), max req/s (bound)."""
    result = json.loads((run_dir / "results.json").read_text())
    knees = {b["name"]: b.get("simulated_knee") for b in result["estimate"]["buckets"]}
    out = []
    for target in result.get("capacity") or []:
        for b in target["buckets"]:
            c, r = b.get("max_concurrency"), b.get("max_request_rate")
            out.append(
                f"{target['target']}/{b['name']}: simulated knee {knees.get(b['name'])}, knee {b.get('knee')}, "
                f"max c {c and c['level']} ({b.get('concurrency_bound')}), "
                f"max req/s {r and r['level']} ({b.get('request_rate_bound')})"
            )
    return out


def run_case(name: str, tree: Path | None, tmp: Path, limit_s: float) -> tuple[float, list[str]]:
    spec, flags = CASES[name]
    if isinstance(spec, str):
        workload = str(ROOT / spec)
    else:
        level, tokens_in, tokens_out, users = spec
        path = tmp / f"{level}.yaml"
        path.write_text(LEVEL.format(name=level, slo=SLO, tokens_in=tokens_in, tokens_out=tokens_out, users=users))
        workload = str(path)
    out = tmp / f"{name}-{'base' if tree else 'this'}-{time.monotonic_ns()}"
    env = dict(os.environ, PYTHONPATH=str(tree)) if tree else dict(os.environ)
    # python -c puts its working folder first on sys.path: the baseline runs in its own tree
    command = [sys.executable, "-c", "import sys; from kvplan.cli import main; sys.argv[0] = 'kvplan'; main()"]
    command += ["simulate", workload, "--quiet", "--out", str(out), *flags]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=tree or ROOT, env=env, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, [f"stopped at the {limit_s:g} s limit (--limit-s)"]
    seconds = time.perf_counter() - start
    if done.returncode:
        return seconds, [f"failed: {done.stderr.strip()[-300:]}"]
    return seconds, answers(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="an earlier tree (git archive) to time beside this one")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--limit-s", type=float, default=300.0, help="stop a case after this many seconds")
    args = parser.parse_args()
    print(f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {machine()}")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for name in args.cases:
            trees = [(None, "this tree")] + ([(args.baseline, f"baseline {args.baseline}")] if args.baseline else [])
            for tree, label in trees:
                seconds, lines = run_case(name, tree, tmp, args.limit_s)
                print(f"{name} ({label}): {seconds:.1f} s")
                for line in lines:
                    print(f"    {line}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
