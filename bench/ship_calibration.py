"""Fit a calibration on a measured run and ship it with kvplan (kvplan/run/sim/calibration/data/NAME.json and
NAME.steps.csv.gz): the default step-time model of ``kvplan simulate`` for that engine.

The machine is named from this machine (CPU model, cores, memory, platform): run it where the run
was measured. Prints the fit (R², held-out levels) and the run's drift check; refuses a run that
drifted unless ``--allow-drift``.

    .venv/bin/python bench/ship_calibration.py RUN_DIR NAME [--source "what the run was"]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402

from kvplan.run.sim.calibration import store as calibrations  # noqa: E402
from kvplan.run.sim.calibration.fit import StepSample, fit_samples  # noqa: E402
from kvplan.run.sim.calibration.view import print_calibration  # noqa: E402


def this_machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    flags = Path("/proc/cpuinfo").read_text()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores{' with avx512_bf16' if 'avx512_bf16' in flags else ''}, "
        f"{memory:.0f} GiB, CPU only; {platform.platform()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("name")
    parser.add_argument("--source", help="what the run was (default: the run folder and its workload)")
    parser.add_argument("--allow-drift", action="store_true")
    args = parser.parse_args()
    calibrated = calibrations.from_run(args.run_dir)
    print_calibration(calibrated, Console(width=140))
    if calibrated.drift and not args.allow_drift:
        print("refused: the run drifted (see above); rerun it on a quiet machine or pass --allow-drift")
        return 1
    # fitted again on the samples as the CSV keeps them (0.1 us), so the shipped file refits exactly
    samples = [
        StepSample(s.level, s.work, round(s.seconds, 7), None if s.gap_s is None else round(s.gap_s, 7))
        for s in calibrated.samples
    ]
    fit = fit_samples(samples, held_out=False)
    c = calibrated.calibration
    shipped = calibrations.Calibration(
        args.name, fit.model, c.engine, this_machine(), args.source or c.source, fit.r2, fit.num_steps
    )
    path = calibrations.save(shipped, samples)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
