"""How many streams and chunks/s kvplan's load client holds, and how far its per-chunk timestamps
are from the truth, against the fast fake server (tests/kvplan/run/server/fake_server.py) in a process of
its own.

Every chunk the fake server writes carries ``t`` = ``time.perf_counter()`` just before the write
(one clock for every process of the machine); the client stamps the chunk when its loop reads it
(``time.perf_counter()``), so ``stamp - t`` is the client's timestamp error (the loopback's own
microseconds included). ``--streams`` (1,000) requests
start evenly over one interval, each streaming ``--tokens`` chunks one every ``--interval-ms``
(1,000 streams x one chunk per 50 ms = 20,000 chunks/s). Prints streams completed, chunks/s over
the time every stream was live, the error's P50/P99/max over that window and over every chunk,
how late the client's loop ran (its lag: how late a 5 ms timer fired), and the client's CPU per chunk.
Targets: 1,000 streams, 20,000 chunks/s, error <= 1 ms.

    .venv/bin/python bench/client_capacity.py [--streams 1000] [--interval-ms 50] [--workers 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def percentiles(values_ms: np.ndarray) -> str:
    if not values_ms.size:
        return "none"
    return f"p50 {np.percentile(values_ms, 50):.3f}, p99 {np.percentile(values_ms, 99):.3f}, max {values_ms.max():.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--interval-ms", type=float, default=50.0)
    parser.add_argument(
        "--workers", type=int, default=1, help="client event loops (1: in this process; more: a process each)"
    )
    parser.add_argument(
        "--spread-ms",
        type=float,
        default=None,
        help="start the streams evenly over this long (default: one interval; 0: all at once)",
    )
    parser.add_argument("--by-second", action="store_true", help="also the error per second of the run")
    args = parser.parse_args()
    spread_s = (args.interval_ms if args.spread_ms is None else args.spread_ms) / 1e3

    from kvplan.run.driver import Submission
    from kvplan.run.server.backend import BodySpec, HttpBackend

    server = subprocess.Popen(
        [sys.executable, "tests/kvplan/run/server/fake_server.py", "--interval-ms", str(args.interval_ms)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    url = server.stdout.readline().split()[-1]
    spec = BodySpec(url, "completions", "fake-model", exact=False, salt=False, extra_body={}, decode=None)
    backend = HttpBackend(spec, {}, 600.0, args.workers, None)
    backend.raw = []
    cpu0 = os.times()
    try:
        backend.client_stats()  # lag and CPU from here on
        start = time.perf_counter()
        for i in range(args.streams):
            time.sleep(max(0.0, start + i * spread_s / args.streams - time.perf_counter()))
            backend.submit(Submission(f"r{i}", (1, 2, 3), args.tokens, 0, "", None))
        done = 0
        while done < args.streams:
            finished, _ = backend.advance(None)
            done += len(finished)
        lags, loop_cpu = backend.client_stats()
    finally:
        backend.close()
        server.terminate()
    cpu1 = os.times()

    stamps, sent, failed = [], [], 0
    for result in backend.raw:
        failed += bool(result.error)
        for at, payload in result.events:
            if payload.startswith(b"{") and b'"t":' in payload:
                stamps.append(at)
                sent.append(json.loads(payload)["t"])
    stamps, sent = np.asarray(stamps), np.asarray(sent)
    error_ms = (stamps - sent) * 1e3
    # every stream live: from the last stream's first chunk to the first stream's last
    lo = max(r.events[0][0] for r in backend.raw if r.events)
    hi = min(r.events[-1][0] for r in backend.raw if r.events)
    window = (stamps >= lo) & (stamps <= hi)
    rate = window.sum() / (hi - lo) if hi > lo else float("nan")
    print(
        f"{args.streams - failed}/{args.streams} streams completed ({failed} failed), {stamps.size:,} chunks;"
        f" {args.workers} client event loop(s){' in processes' if args.workers > 1 else ' in this process'}"
    )
    print(f"chunks/s with every stream live: {rate:,.0f} (target >= 20,000) over {hi - lo:.1f} s")
    print(f"timestamp error ms, every stream live: {percentiles(error_ms[window])} (target <= 1)")
    print(f"timestamp error ms, every chunk (start-up and wind-down too): {percentiles(error_ms)}")
    if args.by_second:
        t0 = stamps.min()
        for second in range(int(stamps.max() - t0) + 1):
            chosen = (stamps - t0 >= second) & (stamps - t0 < second + 1)
            print(f"  second {second}: {chosen.sum():,} chunks, {percentiles(error_ms[chosen])}")
    lag = np.asarray(lags) * 1e3
    print(
        f"client loop lag ms (how late a 5 ms timer fired): {percentiles(lag)};"
        f" client CPU {loop_cpu:.1f} s in the loops = {loop_cpu / max(stamps.size, 1) * 1e6:.0f} us per chunk"
        f" (this process {cpu1.user - cpu0.user + cpu1.system - cpu0.system:.1f} s) [load {os.getloadavg()[0]:.1f}]"
    )


if __name__ == "__main__":
    main()
