"""Calibrated on one measured run, predicting another run with other levels: TTFT and TPOT per level.

Fits the step-time model on CALIBRATE_RUN (``kvplan simulate --calibrate``: R² and held-out
levels printed), simulates PREDICT_RUN's own workload with it, and prints per level the measured
and predicted TTFT and TPOT at P50 and P95 with the % error ``(predicted - measured) / measured``,
then the share of levels within 10 % at P50 and within 20 % at P95 (the targets: at least 90 %
of levels within 10 % at P50; P95 within 20 %), and the run's drift check.

    .venv/bin/python bench/sim_calibration.py CALIBRATE_RUN PREDICT_RUN
    .venv/bin/python bench/sim_calibration.py --shipped PREDICT_RUN   # the shipped calibration instead
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvplan.results.run_result import load_run, read_result  # noqa: E402
from kvplan.run.sim.calibration import store as calibrations  # noqa: E402
from kvplan.run.sim.calibration.drift import find_drift  # noqa: E402
from kvplan.run.sim.run import simulate  # noqa: E402
from kvplan.run.sim.setups import calibrated_setup  # noqa: E402
from kvplan.workload.file import load_workload  # noqa: E402

METRICS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))


def level_errors(measured, predicted) -> list[dict]:
    """Per level both ran: measured and predicted P50/P95 of TTFT and TPOT, and the % errors."""
    rows = []
    theirs = {lv.key: lv for lv in predicted.levels}
    for lv in measured.levels:
        sim = theirs.get(lv.key)
        if sim is None:
            continue
        row = {"level": lv.key.name}
        for name, attr in METRICS:
            for q in ("p50", "p95"):
                m, p = getattr(getattr(lv, attr), q), getattr(getattr(sim, attr), q)
                row[f"{name} {q}"] = (m, p, (p / m - 1) * 100)
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> dict[str, float]:
    cols = [f"{name} {q}" for name, _ in METRICS for q in ("p50", "p95")]
    print(f"{'level':22s}" + "".join(f"{c + ' ms meas/pred (err %)':>34s}" for c in cols))
    for row in rows:
        print(f"{row['level']:22s}" + "".join(f"{m:>12.1f}/{p:<9.1f}({e:+6.1f})" for m, p, e in (row[c] for c in cols)))
    share = {c: sum(abs(row[c][2]) <= (10 if c.endswith("p50") else 20) for row in rows) / len(rows) for c in cols}
    print("within 10 % at P50 / 20 % at P95: " + ", ".join(f"{c} {v:.0%}" for c, v in share.items()))
    return share


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calibrate_run", type=Path, nargs="?")
    parser.add_argument("predict_run", type=Path)
    parser.add_argument("--shipped", action="store_true", help="use the shipped calibration of the engine")
    args = parser.parse_args()
    workload = load_workload(args.predict_run / "workload.yaml")
    if args.shipped:
        calibration = calibrations.default_for(workload)
        print(f"shipped calibration {calibration.name}: {calibration.source}, R² {calibration.r2:.3f}")
    else:
        from rich.console import Console

        from kvplan.run.sim.calibration.view import print_calibration

        calibrated = calibrations.from_run(args.calibrate_run)
        print_calibration(calibrated, Console(width=140))
        calibration = calibrated.calibration
    drift = find_drift(load_run(args.predict_run).steps)
    for d in drift:
        print(f"predicted run: warning: {d.describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        run = simulate(workload, calibrated_setup(workload, calibration), Path(tmp) / "sim", search=False)
        share = print_table(level_errors(read_result(args.predict_run), read_result(run)))
    ok = share["TTFT p50"] >= 0.9 and share["TPOT p50"] >= 0.9 and share["TTFT p95"] == share["TPOT p95"] == 1.0
    print("targets met" if ok else "targets missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
