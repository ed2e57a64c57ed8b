"""``kvplan plan --window 3600`` on a day of traffic at its real size: a generated Mooncake-format day
(bench/profile_scale.py's generator: the published Mooncake conversation trace's lengths, turns and
3 s ticks, about 10.2 requests a tick swung +-50 % over 24 h, some 290,000 requests) sized hour by
hour on the default grid (6 GPU kinds x tp 1, 2, 4, 8) for Llama-3.1-70B, prompts clipped to 8,192
tokens and replies to 1,024 (the workload below), each window judged on 300 of its requests. Prints
the wall time against the target (5 minutes, issue 38), the same grid's plain ``kvplan plan --rate``
at the busiest hour's rate in the same run on the busiest hour's judged requests (the peer: what
sizing every window adds; a plain plan over the whole day's requests builds every prompt and does
not fit this machine's memory), the replicas per hour, both costs, the date and the machine.

    .venv/bin/python bench/plan_trace_day.py                 # alone on the machine
    .venv/bin/python bench/plan_trace_day.py --hours 2       # a lighter slice
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
from profile_scale import generate, machine  # noqa: E402

WORKLOAD = """name: day
seed: 0
engine:
  model: SmolLM2-135M-Instruct
  max_model_len: 16384
  enable_prefix_caching: true
dataset:
  kind: trace
  path: day.jsonl
  max_input_tokens: 8192
  max_output_tokens: 1024
slo: {ttft_ms: 2000, tpot_ms: 50}
buckets:
  - name: day
"""
PER_HOUR = 10.2 * 1200  # requests an hour at the mean rate (bench/profile_scale.py)


def _kvplan(*args: str) -> tuple[float, dict]:
    """``kvplan ARGS --json`` in a child process: its wall time, s, and its JSON."""
    start = time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("kvplan")), *args, "--json"], capture_output=True, text=True, check=False
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"kvplan {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return took, json.loads(done.stdout)


def busiest_hour(trace: Path, out: Path, cap: int) -> int:
    """Write the busiest hour's judged lines (what ``--window 3600`` ranks the grid on: at most
    ``cap``, evenly spaced; kvplan.optimize.plan_windows) to ``out``; returns the hour's arrivals."""
    from kvplan.optimize.plan_windows import judged_lines

    rows = trace.read_text().splitlines()
    stamps = [json.loads(r)["timestamp"] / 1000 for r in rows]
    hours: dict[int, list[int]] = {}
    for i, t in enumerate(stamps):
        hours.setdefault(int((t - stamps[0]) // 3600), []).append(i)
    top = max(hours.values(), key=len)
    out.write_text("".join(rows[i] + "\n" for i in judged_lines(top, cap)))
    return len(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=24.0, help="hours of traffic (default: a day)")
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--window-requests", type=int, default=300)
    args = parser.parse_args()
    print(f"kvplan plan --window 3600 on a generated day ({dt.date.today()}, {machine()})")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        made = generate(folder / "day.jsonl", round(args.hours * PER_HOUR))
        # the lines within the hours asked (a workload's trace may span at most a level's 24 h)
        span_ms = args.hours * 3.6e6
        kept = sum(1 for line in open(folder / "day.jsonl") if json.loads(line)["timestamp"] < span_ms)
        (folder / "day.yaml").write_text(
            WORKLOAD.replace("  path: day.jsonl", f"  path: day.jsonl\n  max_requests: {kept}")
        )
        print(f"  trace: {kept:,} requests over {args.hours:g} h (of {made['requests']:,} generated)", flush=True)
        common = ["--model", args.model, "--jobs", str(args.jobs)]
        window = ["--window", "3600", "--window-requests", str(args.window_requests)]
        took, run = _kvplan("plan", str(folder / "day.yaml"), *common, *window, "--out", str(folder / "w"))
        peak = run["load"]["rate"]
        windows = run["windows"]
        print(
            f"  busiest hour {peak:g} req/s; wall time {took:.1f} s"
            f" (target 300 s: {'met' if took <= 300 else 'not met'})"
        )
        if windows is None:
            print("  no configuration meets the SLO at the busiest hour: nothing sized per window")
        else:
            print(
                f"  best {windows['gpu']} x{windows['tp']}; replicas per hour:",
                [w["replicas"] for w in windows["windows"]],
            )
            static, following = windows["static_usd"], windows["following_usd"]
            if static is not None and following is not None:
                print(f"  static ${static:,.2f} vs following ${following:,.2f} (scale-up {windows['scale_up_s']:g} s)")
        # the peer: the plain one-rate plan of the same grid on the busiest hour's judged requests
        busiest_hour(folder / "day.jsonl", folder / "peak.jsonl", args.window_requests)
        (folder / "peak.yaml").write_text(WORKLOAD.replace("day.jsonl", "peak.jsonl"))
        peer, _ = _kvplan("plan", str(folder / "peak.yaml"), *common, "--rate", f"{peak:g}", "--out", str(folder / "p"))
    print(
        f"  peer, kvplan plan --rate {peak:g} on the busiest hour's judged requests: {peer:.1f} s;"
        f" windows / peer = {took / peer:.2f}"
    )


if __name__ == "__main__":
    main()
