"""kvplan simulate's GPU roofline against public measured serving results: predict, print, fit.

Every record of tests/kvplan/data/public_serving_benchmarks.yaml (bench/public_cases.py says how
each becomes a simulation) is simulated on its GPU with the roofline of kvplan.plan.step_cost, and
the predicted output tok/s, TPOT and TTFT are printed beside the published ones with the % error
(``(predicted - published) / published``), then the median |error| of output tok/s and of TPOT.

``--fit`` searches the three shared constants (compute efficiency, memory efficiency, per-step
overhead) that minimise the mean squared log error of output tok/s and TPOT over all records, by
coordinate descent (each constant in turn by golden-section search in its range, two rounds);
``--write`` stores them in kvplan/plan/data/gpu_perf.yaml's ``serving_fit``. About 15 s per
evaluation of the 13 records on the 2-core machine; run under the CPU lock:

    flock /tmp/kvplan-cpu.lock .venv/bin/python bench/gpu_cost_fit.py [--fit [--write]]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.public_cases import Case, load_cases  # noqa: E402
from kvplan.load.sim.gpu_target import gpu_setup  # noqa: E402
from kvplan.load.sim.run import sample  # noqa: E402
from kvplan.load.sim.search import Prober  # noqa: E402
from kvplan.plan.gpu_perf import GPU_PERF_FILE, ServingFit, serving_fit  # noqa: E402

RANGES = {"compute_efficiency": (0.2, 1.0), "memory_efficiency": (0.4, 1.0), "step_overhead_s": (0.0, 0.006)}


def predict(case: Case, fit: ServingFit) -> dict[str, float | None]:
    """The case's level simulated on its GPU with ``fit``: output tok/s, TPOT and TTFT (ms)."""
    setup = gpu_setup(case.workload, case.model, case.gpu, case.tp, gpu_memory_utilization=case.utilization, fit=fit)
    bucket = case.workload.buckets[0]
    mode, value = ("closed", bucket.concurrency[0]) if bucket.concurrency else ("open", bucket.request_rates[0])
    level = Prober(case.workload, setup.facts, setup.clock, sample(case.workload, setup.facts).requests).level(
        0, mode, value
    )
    return {
        "output_tok_s": level.output_tokens_per_s,
        "tpot_ms": getattr(level.tpot_ms, case.tpot_stat) if level.tpot_ms else None,
        "ttft_ms": getattr(level.ttft_ms, case.ttft_stat) if level.ttft_ms else None,
    }


def error_pct(predicted: float | None, published: float | None) -> float | None:
    return None if predicted is None or published is None else (predicted / published - 1) * 100


def evaluate(cases: list[Case], fit: ServingFit) -> list[dict]:
    """Per case: the predictions, the published numbers and the % errors."""
    rows = []
    for case in cases:
        got = predict(case, fit)
        rows.append(
            {
                "case": case,
                **{f"pred_{k}": v for k, v in got.items()},
                **{f"err_{k}": error_pct(got[k], getattr(case, k)) for k in got},
            }
        )
    return rows


def loss(rows: list[dict]) -> float:
    """Mean squared log error of output tok/s and TPOT over every record that prints them."""
    logs = [
        math.log1p(r[f"err_{k}"] / 100) ** 2
        for r in rows
        for k in ("output_tok_s", "tpot_ms")
        if r[f"err_{k}"] is not None
    ]
    return float(np.mean(logs))


def medians(rows: list[dict]) -> dict[str, float]:
    return {
        k: float(np.median([abs(r[f"err_{k}"]) for r in rows if r[f"err_{k}"] is not None]))
        for k in ("output_tok_s", "tpot_ms", "ttft_ms")
    }


def print_rows(rows: list[dict], fit: ServingFit) -> None:
    print(
        f"fit: compute efficiency {fit.compute_efficiency:.3f}, memory efficiency {fit.memory_efficiency:.3f}, "
        f"step overhead {fit.step_overhead_s * 1e3:.2f} ms"
    )
    head = (
        f"{'record':58s} {'out tok/s pred/pub':>22s} {'err%':>6s} {'TPOT ms pred/pub':>20s} {'err%':>6s} "
        f"{'TTFT ms pred/pub':>22s} {'err%':>6s}"
    )
    print(head)
    fmt = lambda v, d=1: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    for r in rows:
        c = r["case"]
        print(
            f"{c.id[:58]:58s} {fmt(r['pred_output_tok_s']):>10s}/{fmt(c.output_tok_s):<11s} "
            f"{fmt(r['err_output_tok_s'], 0):>6s} {fmt(r['pred_tpot_ms'], 2):>9s}/{fmt(c.tpot_ms, 2):<10s} "
            f"{fmt(r['err_tpot_ms'], 0):>6s} {fmt(r['pred_ttft_ms']):>10s}/{fmt(c.ttft_ms):<11s} "
            f"{fmt(r['err_ttft_ms'], 0):>6s}"
        )
    m = medians(rows)
    print(
        f"median |error|: output tok/s {m['output_tok_s']:.1f} %, TPOT {m['tpot_ms']:.1f} %, "
        f"TTFT {m['ttft_ms']:.1f} % (TTFT not fitted)"
    )


def fit_constants(cases: list[Case], start: ServingFit, rounds: int = 2) -> ServingFit:
    """Coordinate descent over RANGES, golden-section search per constant."""
    values = {
        "compute_efficiency": start.compute_efficiency,
        "memory_efficiency": start.memory_efficiency,
        "step_overhead_s": start.step_overhead_s,
    }
    cache: dict[tuple, float] = {}

    def cost(v: dict) -> float:
        key = tuple(round(x, 6) for x in v.values())
        if key not in cache:
            cache[key] = loss(evaluate(cases, ServingFit(**v)))
            print(f"  {key} -> {cache[key]:.5f}", flush=True)
        return cache[key]

    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(rounds):
        for name, (low, high) in RANGES.items():
            a, b = low, high
            for _ in range(7):  # the bracket shrinks to 0.618**7 = 3.4 % of the range
                c, d = b - ratio * (b - a), a + ratio * (b - a)
                if cost({**values, name: c}) <= cost({**values, name: d}):
                    b = d
                else:
                    a = c
            values[name] = (a + b) / 2
    return ServingFit(**values)


def write_fit(fit: ServingFit, rows: list[dict]) -> None:
    m = medians(rows)
    text = GPU_PERF_FILE.read_text()
    block = (
        f"serving_fit:\n  compute_efficiency: {fit.compute_efficiency:.4f}\n"
        f"  memory_efficiency: {fit.memory_efficiency:.4f}\n  step_overhead_ms: {fit.step_overhead_s * 1e3:.4f}\n"
        f'  fitted_on: "bench/gpu_cost_fit.py --fit on the {len(rows)} records of public_serving_benchmarks.yaml, '
        f"{time.strftime('%Y-%m-%d')}: median |error| output tok/s {m['output_tok_s']:.1f} %, TPOT "
        f'{m["tpot_ms"]:.1f} %, TTFT {m["ttft_ms"]:.1f} % (not fitted)"\n'
    )
    GPU_PERF_FILE.write_text(re.sub(r"serving_fit:\n(  .*\n)+", block, text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="search the three constants first")
    parser.add_argument("--write", action="store_true", help="with --fit: store them in gpu_perf.yaml")
    args = parser.parse_args()
    cases, fit = load_cases(), serving_fit()
    if args.fit:
        fit = fit_constants(cases, fit)
    rows = evaluate(cases, fit)
    print_rows(rows, fit)
    if args.fit and args.write:
        write_fit(fit, rows)
        print(f"written: {GPU_PERF_FILE}")


if __name__ == "__main__":
    main()
