"""How many streams and chunks/s kvplan's load client holds, and how far its per-chunk timestamps
are from the truth, against the fast fake server (tests/kvplan/load/fake_server.py) in a process of
its own.

Every chunk the fake server writes carries ``t`` = ``time.perf_counter()`` just before the write
(one clock for every process of the machine); the client stamps the chunk on arrival, so
``arrival - t`` is the client's timestamp error (plus the loopback's own microseconds). ``--streams``
(1,000) requests are started at once, each streaming ``--tokens`` chunks one every
``--interval-ms`` (1,000 streams x one chunk per 50 ms = 20,000 chunks/s). Prints streams completed,
chunks/s over the time every stream was live, the error's P50/P99/max, and the client's CPU.
Targets: 1,000 streams, 20,000 chunks/s, error <= 1 ms.

    .venv/bin/python bench/client_capacity.py [--streams 1000] [--interval-ms 50] [--workers 2]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--interval-ms", type=float, default=50.0)
    parser.add_argument("--workers", type=int, default=2, help="client processes (1: one loop in this process)")
    args = parser.parse_args()

    from kvplan.load.backends.http import BodySpec, HttpBackend
    from kvplan.load.driver import Submission

    server = subprocess.Popen([sys.executable, "tests/kvplan/load/fake_server.py", "--interval-ms",
                               str(args.interval_ms)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    url = server.stdout.readline().split()[-1]
    spec = BodySpec(url, "completions", "fake-model", exact=False, salt=False, extra_body={}, decode=None)
    backend = HttpBackend(spec, {}, 600.0, args.workers, None)
    backend.raw = []
    cpu0 = os.times()
    try:
        for i in range(args.streams):
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
    errors, arrivals, failed = [], [], 0
    for result in backend.raw:
        if result.error:
            failed += 1
        for at, payload in result.events:
            if payload.startswith(b"{") and b'"t":' in payload:
                errors.append(at - json.loads(payload)["t"])
                arrivals.append(at)
    arrivals.sort()
    # chunks/s while every stream is live: from the last stream's first chunk to the first stream's last
    firsts = [r.events[0][0] for r in backend.raw if r.events]
    lasts = [r.events[-1][0] for r in backend.raw if r.events]
    lo, hi = max(firsts), min(lasts)
    steady = sum(lo <= a <= hi for a in arrivals) / (hi - lo) if hi > lo else float("nan")
    err = np.asarray(errors) * 1e3
    print(f"{args.streams - failed}/{args.streams} streams completed ({failed} failed), {len(errors):,} chunks;"
          f" {args.workers} client worker(s)")
    print(f"chunks/s with every stream live: {steady:,.0f} (target >= 20,000) over {hi - lo:.1f} s")
    print(f"timestamp error ms: p50 {np.percentile(err, 50):.3f}, p99 {np.percentile(err, 99):.3f},"
          f" max {err.max():.3f} (target <= 1)")
    lag = np.asarray(lags) * 1e3
    print(f"client loop lag ms: p99 {np.percentile(lag, 99):.3f}, max {lag.max():.3f};"
          f" client CPU {loop_cpu:.1f} s in the loops (this process {cpu1.user - cpu0.user + cpu1.system - cpu0.system:.1f} s)"
          f" [load {os.getloadavg()[0]:.1f}]")


if __name__ == "__main__":
    main()
