"""``kvplan profile`` on a million requests: a generated Mooncake-format log profiled in a fresh
process, its wall time and peak memory printed (targets: at most 60 s and 1 GB), with the date and
the machine; then, with ``--check``, the streamed profile of its first 4,000 lines against the
in-memory path's (kvplan.profile.csv_traces.read_trace, which reads a JSONL log whole with
kvplan.profile.parsed.read_log, + kvplan.profile.stats.profile_log), key by key.

The log's shape is the published Mooncake conversation trace's (github.com/kvcache-ai/Mooncake,
FAST25-release/traces/conversation_trace.jsonl: 12,031 requests over one hour), measured from it and
drawn here by inverse CDF over its quantiles (``*_Q`` below: 0, 1, 5, 10, 20, ..., 90, 95, 99, 100%):

- arrivals: the trace's timestamps fall on 3 s ticks, about 10.2 requests a tick; here each 3 s
  tick draws a Poisson count of mean 10.2 x (1 + 0.5 sin(2 pi t / 24 h - pi / 2)), a day's swing
  from 5.1 to 15.3 a tick (the published hour has no day in it; the swing gives ``load`` a shape), so
  a million requests span some 82 hours;
- conversations: in the trace, 38.7% of requests carry more than the shared first block of an
  earlier one (a later turn of a conversation: its history resent), 61.3% only block 0 (a system
  prompt every request shares). Here each request ends its conversation with probability 0.613, so
  the same share are later turns; the next turn comes a gap later drawn from the trace's gaps
  between a turn and the one before it (``GAP_Q``, P50 123 s), at the first tick with room;
- lengths: a first turn's prompt is block 0 and fresh blocks, its length from the trace's first
  turns (``FIRST_Q``, P50 5,264 tokens); a later turn shares its parent's blocks but the last (85%
  of the trace's later turns do; else a share of them drawn uniformly) and adds new tokens from the
  trace's (``NEW_Q``, P50 829, at least 1); outputs from the trace's (``OUTPUT_Q``, P50 350). One
  hash id per 512 tokens, ids numbered as new blocks appear, as in the trace. Prompts are capped at
  126,195 tokens, the trace's longest.

The profile runs as ``kvplan profile LOG --json`` in a child process; its wall time is measured
around it and its peak memory is the child's ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``
(the peak resident set of the process, imports included; KiB on Linux).

    .venv/bin/python bench/profile_scale.py                  # 1,000,000 requests, alone on the machine
    .venv/bin/python bench/profile_scale.py --check          # and the 4,000-line slice, both paths
"""

from __future__ import annotations

import argparse
import datetime as dt
import heapq
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
QUANTILES = [0, 1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 100]
FIRST_Q = [891, 894, 897, 905, 1092, 1757, 3913, 5264, 7418, 10771, 15871, 25559, 38494, 89868, 126195]
NEW_Q = [1, 1, 163, 305, 473, 590, 698, 829, 992, 1679, 5018, 9741, 14691, 26705, 94968]
GAP_Q = [0, 12, 30, 42, 60, 75, 96, 123, 162, 222, 318, 483, 615, 1477, 3030]
OUTPUT_Q = [1, 3, 10, 24, 100, 213, 291, 350, 399, 447, 504, 597, 698, 1119, 2000]
BLOCK = 512
TICK_MS = 3000
PER_TICK = 10.2
LAST_TURN = 0.613
KEEP_ALL_BUT_LAST = 0.85
MAX_INPUT = 126_195


def _draw(rng: np.random.Generator, table: list[int], scale: float = 1.0) -> int:
    return max(1, round(float(np.interp(rng.uniform(0, 100), QUANTILES, table)) * scale))


def generate(path: Path, num_requests: int, seed: int = 0, scale: float = 1.0) -> dict:
    """Write ``num_requests`` Mooncake lines of the shape above to ``path`` (prompt lengths times
    ``scale``, for a lighter slice); returns the tokens and blocks written."""
    rng = np.random.default_rng(seed)
    next_id, tick, written, tokens = 1, 0, 0, 0
    due: list[tuple[int, int, list[int]]] = []  # (tick, order, parent's hash ids)
    order = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < num_requests:
            t = tick * TICK_MS / 1000
            rate = PER_TICK * (1 + 0.5 * np.sin(2 * np.pi * t / 86_400 - np.pi / 2))
            for _ in range(min(int(rng.poisson(rate)), num_requests - written)):
                if due and due[0][0] <= tick:
                    _, _, parent = heapq.heappop(due)
                    keep = (
                        len(parent) - 1 if rng.random() < KEEP_ALL_BUT_LAST else int(rng.integers(1, len(parent) + 1))
                    )
                    base = parent[: max(1, keep)]
                    length = min(len(base) * BLOCK + _draw(rng, NEW_Q, scale), round(MAX_INPUT * max(scale, 1.0)))
                else:
                    base = [0]
                    length = max(_draw(rng, FIRST_Q, scale), 1)
                need = -(-length // BLOCK)
                ids = base[:need] + list(range(next_id, next_id + max(0, need - len(base))))
                next_id += max(0, need - len(base))
                row = {"timestamp": tick * TICK_MS, "input_length": length, "output_length": _draw(rng, OUTPUT_Q)}
                out.write(json.dumps({**row, "hash_ids": ids}) + "\n")
                written += 1
                tokens += length
                if rng.random() >= LAST_TURN:
                    gap_ticks = max(1, round(_draw(rng, GAP_Q) * 1000 / TICK_MS))
                    heapq.heappush(due, (tick + gap_ticks, order, ids))
                    order += 1
            tick += 1
    return {"requests": written, "prompt_tokens": tokens, "hash_ids": next_id, "hours": tick * TICK_MS / 3.6e6}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        memory = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
        memory = f"{int(memory.split()[1]) / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        memory = "?"
    return f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs, {memory} RAM, Python {platform.python_version()}"


def profile_child(log: Path) -> tuple[float, float, dict]:
    """``kvplan profile LOG --json`` in a child: (wall s, peak RSS MiB, its JSON)."""
    code = "import sys; from kvplan.cli import main; sys.argv = ['kvplan'] + sys.argv[1:]; main()"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, "profile", str(log), "--json"], capture_output=True, text=True, cwd=ROOT
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"kvplan profile failed ({done.returncode}): {done.stderr[-2000:]}")
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return wall, peak_mib, json.loads(done.stdout)


def check_slice(log: Path, lines: int, block_sizes: tuple[int, ...] = (16,)) -> list[str]:
    """The streamed profile of the log's first ``lines`` lines against the in-memory path's: the keys
    (and per-request arrays) that differ, [] when all are equal."""
    sys.path.insert(0, str(ROOT))
    from kvplan.profile.csv_traces import read_trace
    from kvplan.profile.stats import profile_log
    from kvplan.profile.stream import profile_stream

    part = log.with_name(f"{log.stem}.first{lines}.jsonl")
    with open(log, encoding="utf-8") as source, open(part, "w", encoding="utf-8") as out:
        for _, line in zip(range(lines), source):
            out.write(line)
    differ = []
    for block_size in block_sizes:
        start = time.perf_counter()
        streamed = profile_stream(part, block_size=block_size)
        took_stream = time.perf_counter() - start
        start = time.perf_counter()
        whole = profile_log(read_trace(part), block_size)
        took_whole = time.perf_counter() - start
        print(
            f"  slice of {lines} lines, block {block_size}: streamed {took_stream:.1f} s, in memory {took_whole:.1f} s"
        )
        differ += [
            f"{block_size}: {k}" for k in whole.data if json.dumps(whole.data[k]) != json.dumps(streamed.data[k])
        ]
        for name in ("reused_tokens", "shared_tokens", "reuse_by_block"):
            if not np.array_equal(getattr(whole.prefix, name), getattr(streamed.prefix, name)):
                differ.append(f"{block_size}: prefix.{name}")
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", type=Path, help="profile this log instead of generating one (kept)")
    parser.add_argument(
        "--check", action="store_true", help="also compare the first 4,000 lines with the in-memory path"
    )
    args = parser.parse_args()
    print(f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} on {machine()}")
    with tempfile.TemporaryDirectory() as folder:
        log = args.log
        if log is None:
            log = Path(folder) / "mooncake_1m.jsonl"
            start = time.perf_counter()
            made = generate(log, args.requests, args.seed)
            print(
                f"generated {made['requests']:,} requests ({made['prompt_tokens'] / 1e9:.2f} G prompt tokens,"
                f" {made['hash_ids']:,} hash ids, {made['hours']:.1f} h, {log.stat().st_size / 2**20:.0f} MiB)"
                f" in {time.perf_counter() - start:.0f} s"
            )
        wall, peak, data = profile_child(log)
        verdict = "met" if wall <= 60 and peak <= 1024 else "NOT met"
        print(
            f"kvplan profile: {wall:.1f} s wall, peak RSS {peak:.0f} MiB (ru_maxrss) -- target 60 s / 1 GiB {verdict}"
        )
        load = data["load"]
        print(
            f"  {data['num_requests']:,} requests; input P50/P99 {data['input_tokens']['p50']:.0f}/"
            f"{data['input_tokens']['p99']:.0f}, output P50 {data['output_tokens']['p50']:.0f}; prefix reuse"
            f" {data['prefix_reuse']:.1%}; rate {data['arrival']['rate_per_s']:.2f} req/s; peak minute"
            f" {load['peak_per_minute']}, P99 minute {load['p99_per_minute']:.0f} req/min"
        )
        if args.check:
            differ = check_slice(log, 4000)
            print("  streamed == in memory on the 4,000-line slice" if not differ else f"  DIFFER: {differ}")


if __name__ == "__main__":
    main()
