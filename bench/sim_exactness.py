"""The simulator against a measured SmolLM2 run, level by level: preemptions and peak used blocks.

Simulates the measured run's own workload (its run folder's workload.yaml) twice: replaying the
measured step times (kvplan.run.sim.replay: open-loop arrivals meet the same steps) and with the
shipped calibration (closed-loop levels never depend on the clock). Prints, per level, the
measured and simulated preemptions and peak used blocks and whether every step agreed (used
blocks, preemptions, requests holding KV), and the knee each shows. Exits 1 on any difference.

    .venv/bin/python bench/sim_exactness.py RUN_DIR      # e.g. a `kvplan loadtest workloads/chat.yaml` run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvplan.results.run_result import load_run  # noqa: E402
from kvplan.run.sim.run import simulate  # noqa: E402
from kvplan.run.sim.setups import engine_setup, replay_setup  # noqa: E402
from kvplan.workload.file import load_workload  # noqa: E402

SAME = (
    "num_used_blocks",
    "num_preemptions",
    "num_running",
    "num_prefill_tokens",
    "num_decode_tokens",
    "kv_resident_tokens",
)


def by_level(steps):
    levels = {}
    for s in steps:
        levels.setdefault(s.key, []).append(s)
    return levels


def compare(measured, simulated, closed_only: bool) -> list[tuple]:
    """Per level: (label, measured preemptions, simulated, measured peak blocks, simulated, every step equal)."""
    theirs, mine = by_level(measured.steps), by_level(simulated.steps)
    rows = []
    for lv in measured.result.levels:
        if closed_only and lv.mode != "closed":
            continue
        sim = next(s for s in simulated.result.levels if s.key == lv.key)
        a, b = theirs.get(lv.key, []), mine.get(lv.key, [])
        equal = len(a) == len(b) and all(getattr(x, f) == getattr(y, f) for x, y in zip(a, b) for f in SAME)
        rows.append(
            (
                lv.key.name,
                lv.num_preemptions,
                sim.num_preemptions,
                lv.peak_used_blocks,
                sim.peak_used_blocks,
                len(a),
                equal,
            )
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    measured = load_run(args.run_dir)
    workload = load_workload(args.run_dir / "workload.yaml")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, setup, closed_only in (
            ("replayed step times", replay_setup(workload, args.run_dir), False),
            ("shipped calibration", engine_setup(workload)[0], True),
        ):
            start = time.perf_counter()
            simulated = load_run(simulate(workload, setup, Path(tmp) / name.replace(" ", "-"), search=False))
            seconds = time.perf_counter() - start
            rows = compare(measured, simulated, closed_only)
            print(
                f"\n{name}: {len(simulated.steps):,} simulated steps in {seconds:.2f} s "
                f"(measured {len(measured.steps):,} steps)"
            )
            print(f"{'level':24s} {'preemptions meas/sim':>22s} {'peak blocks meas/sim':>22s} {'steps':>7s} every step")
            for label, p_m, p_s, b_m, b_s, steps, equal in rows:
                print(
                    f"{label:24s} {p_m:>10d}/{p_s:<11d} {b_m:>10d}/{b_s:<11d} {steps:>7,d} "
                    f"{'equal' if equal else 'DIFFERENT'}"
                )
                ok &= p_m == p_s and b_m == b_s and equal
            knees = [
                (b.name, b.measured_knee, s.measured_knee, s.simulated_knee)
                for b, s in zip(measured.result.buckets, simulated.result.buckets)
            ]
            for bucket, knee_m, knee_s, exact in knees:
                print(
                    f"knee {bucket}: measured {knee_m}, simulated levels {knee_s},"
                    f" simulated at every concurrency {exact}"
                )
                ok &= knee_m == knee_s
    print("\nall equal" if ok else "\nDIFFERENCES FOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
