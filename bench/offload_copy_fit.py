"""This machine's KV offload loads, fitted as setup + bytes / bandwidth: the calibration of the
simulator's transfer price on the bundled engine (kvplan/sizing/gpus/offload.py, docs/simulate.md
"KV offload tiers").

The engine's own mover (engine.offload.storage.KVMover) on a pool of SmolLM2-135M's shape (30
layers, 3 KV heads of 64 dims, bf16, blocks of 16 tokens: 368,640 bytes a block, as
bench/offload_ttft.py), on this machine's device (the CPU here): for n = 1, 2, 4, ..., 64 blocks,
the time of one step's loads as the engine does them (``read`` each slot, then one ``write_device``
of all n), from the host tier and, for the disk leg, the ``read`` of n slots of the disk file
alone; the fastest of ``--repeat`` runs each. A line of least relative error through (bytes, seconds) gives
the setup (intercept) and the bandwidth (1 / slope), each size's measured time and the
line's error on it.

    .venv/bin/python bench/offload_copy_fit.py [--repeat 30]     # under the CPU lock; run twice
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import tempfile
import time

import numpy as np
import torch

from engine.kv_cache import KVCache
from engine.offload.storage import KVMover
from engine.offload.tiers import DISK, HOST

SIZES = (1, 2, 4, 8, 16, 32, 64)


def timed(fn, repeat: int) -> float:
    """Fastest seconds of ``fn()`` over ``repeat`` runs (after one unrecorded warm-up): on a machine
    shared with other work the median of a sub-millisecond copy is sometimes 100x its usual time
    (another process's burst), the minimum is the copy's own cost."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(setup seconds, bytes per second) of the line seconds = setup + bytes / bw of least relative
    error (residuals weighted by 1 / seconds: a 1-block load counts as much as a 64-block one)."""
    x, y = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    slope, intercept = np.polyfit(x, y, 1, w=1 / y)
    return float(intercept), float(1.0 / slope)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    kv = KVCache(30, 3, 64, 16, torch.bfloat16, torch.device("cpu"), num_blocks=2 * max(SIZES))
    for t in (*kv.k_caches, *kv.v_caches):
        t.normal_()
    slots = max(SIZES)
    fd, path = tempfile.mkstemp(prefix="kvplan-copy-fit-", suffix=".bin")
    try:
        os.ftruncate(fd, slots * kv.bytes_per_block)
        mover = KVMover(kv, slots, fd)
        for i in range(slots):  # fill both tiers from the pool, as stores do
            mover.copy("device", i, HOST, i)
            mover.copy("device", i, DISK, i)
        per_block = kv.bytes_per_block
        host, disk = [], []
        for n in SIZES:
            ids = list(range(slots, slots + n))

            def host_load(n=n, ids=ids):
                mover.write_device(ids, [mover.read(HOST, i) for i in range(n)])

            def disk_read(n=n):
                [mover.read(DISK, i) for i in range(n)]

            host.append((n * per_block, timed(host_load, args.repeat)))
            disk.append((n * per_block, timed(disk_read, args.repeat)))
        # the loaded blocks hold the stored bytes (the copies were real)
        assert torch.equal(kv.k_caches[0][slots], kv.k_caches[0][0])
    finally:
        os.close(fd)
        os.unlink(path)
    machine = f"{platform.node()} ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs)"
    print(
        f"bench/offload_copy_fit.py, {dt.date.today()}, {machine}, torch {torch.__version__},"
        f" {per_block:,} bytes a block, fastest of {args.repeat}"
    )
    for name, points in (("host tier -> pool (read + write_device)", host), ("disk tier read (pread)", disk)):
        setup, bw = fit(points)
        rows = ", ".join(f"{b // per_block}: {s * 1e6:.0f} us ({(setup + b / bw) / s - 1:+.0%})" for b, s in points)
        print(f"{name}: setup {setup * 1e6:.1f} us, {bw / 1e9:.3f} GB/s  ({rows})")


if __name__ == "__main__":
    main()
