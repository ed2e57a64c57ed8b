"""kvplan simulate's GPU roofline against public measured serving results: predict, print, fit.

Every record of tests/kvplan/data/public_serving_benchmarks.yaml (bench/public_cases.py says how
each becomes a simulation) is simulated on its GPU with the roofline of kvplan.sizing.gpus.step_cost, and
the predicted output tok/s, TPOT and TTFT are printed beside the published ones with the % error
(``(predicted - published) / published``), then the median |error| of output tok/s and of TPOT.

``--fit`` searches the three shared constants (compute efficiency, memory efficiency, per-step
overhead) that minimise the mean squared log error of output tok/s and TPOT over all records, by
coordinate descent (each constant in turn by golden-section search in its range, two rounds);
``--write`` stores them in kvplan/sizing/data/gpu_perf.yaml's ``serving_fit``. About 15 s per
evaluation of the 13 records on the 2-core machine. The records are simulated with the roofline
(``step_times="roofline"``) when fitting and when printed; the default step times (measured
silicon where aiconfigurator-core's database covers the record, the roofline elsewhere) are
printed as medians beside them.

``--fit-on silicon [--every K]`` fits the same three constants on measured H100-SXM serving runs
instead: every K-th row (default 10, ``rows[::K]``, spread over the file) of
tests/kvplan/data/silicon_h100.yaml, each simulated with the roofline as bench/silicon_check.py
replays it, minimising the mean absolute log error of mean TPOT and mean TTFT (the same
coordinate descent, every evaluation cached). It prints the rows' median |error| before and
after, then the 13 public records with the new constants as a check. ``--write`` stores them
only if they lower the loss on the rows and keep the public records' roofline medians (output
tok/s and TPOT) at or under 20 %. Run under the CPU lock:

    flock /tmp/kvplan-cpu.lock .venv/bin/python bench/gpu_cost_fit.py [--fit [--write]]
    flock /tmp/kvplan-cpu.lock .venv/bin/python bench/gpu_cost_fit.py --fit-on silicon [--every K] [--write]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.public_cases import Case, load_cases  # noqa: E402
from bench.silicon_check import ROWS_FILE, load_rows, simulate_row  # noqa: E402
from kvplan.run.sim.gpu_target import gpu_setup  # noqa: E402
from kvplan.run.sim.run import sample  # noqa: E402
from kvplan.run.sim.search import Prober  # noqa: E402
from kvplan.sizing.gpus.gpu_perf import GPU_PERF_FILE, ServingFit, serving_fit  # noqa: E402

RANGES = {"compute_efficiency": (0.2, 1.0), "memory_efficiency": (0.4, 1.0), "step_overhead_s": (0.0, 0.006)}
MAX_PUBLIC_MEDIAN = 20.0  # --fit-on silicon --write: the public records' roofline medians may not pass this


def predict(case: Case, fit: ServingFit, step_times: str = "auto") -> dict[str, float | None]:
    """The case's level simulated on its GPU with ``fit``: output tok/s, TPOT and TTFT (ms).
    step_times: gpu_setup's (``auto``: measured silicon where covered, else the roofline)."""
    setup = gpu_setup(
        case.workload,
        case.model,
        case.gpu,
        case.tp,
        gpu_memory_utilization=case.utilization,
        fit=fit,
        step_times=step_times,
    )
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


def evaluate(cases: list[Case], fit: ServingFit, step_times: str = "auto") -> list[dict]:
    """Per case: the predictions, the published numbers and the % errors."""
    rows = []
    for case in cases:
        got = predict(case, fit, step_times)
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


def fit_constants(objective: Callable[[ServingFit], float], start: ServingFit, rounds: int = 2) -> ServingFit:
    """Coordinate descent over RANGES, golden-section search per constant, of ``objective``
    (cache it: the search asks for the same point more than once)."""
    values = {
        "compute_efficiency": start.compute_efficiency,
        "memory_efficiency": start.memory_efficiency,
        "step_overhead_s": start.step_overhead_s,
    }

    def cost(v: dict) -> float:
        return objective(ServingFit(**v))

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


def cached(evaluate_fit: Callable[[ServingFit], list[dict]], loss_of: Callable[[list[dict]], float]):
    """``evaluate_fit`` and ``loss_of`` behind a cache keyed by the constants (rounded to 1e-6):
    the objective for :func:`fit_constants`, and the cache (key -> (loss, rows))."""
    cache: dict[tuple[float, ...], tuple[float, list[dict]]] = {}

    def key(fit: ServingFit) -> tuple[float, ...]:
        return tuple(round(x, 6) for x in (fit.compute_efficiency, fit.memory_efficiency, fit.step_overhead_s))

    def objective(fit: ServingFit) -> float:
        k = key(fit)
        if k not in cache:
            t = time.perf_counter()
            rows = evaluate_fit(fit)
            cache[k] = (loss_of(rows), rows)
            print(f"  {k} -> {cache[k][0]:.5f} ({time.perf_counter() - t:.0f} s)", flush=True)
        return cache[k][0]

    return objective, lambda fit: cache[key(fit)]


def evaluate_silicon(rows: list[dict], fit: ServingFit) -> list[dict]:
    """Per silicon_h100.yaml row, simulated with the roofline and ``fit`` as bench/silicon_check.py
    replays it: the row, the % errors of mean TPOT and mean TTFT (None where it did not simulate)
    and the reason."""
    out = []
    for row in rows:
        got = simulate_row((row, "roofline", fit))
        out.append(
            {
                "row": row,
                "err_tpot_ms": error_pct(got.get("tpot_ms"), row["silicon_tpot_ms"]),
                "err_ttft_ms": error_pct(got.get("ttft_ms"), row["silicon_ttft_ms"]),
                "reason": got.get("reason"),
            }
        )
    return out


def silicon_loss(rows: list[dict]) -> float:
    """Mean absolute log error of mean TPOT and mean TTFT over every row that simulated (absolute,
    as bench/silicon_check.py fits: a few rows queue beyond what any step time explains)."""
    logs = [abs(math.log1p(r[k] / 100)) for r in rows for k in ("err_tpot_ms", "err_ttft_ms") if r[k] is not None]
    return float(np.mean(logs))


def silicon_medians(rows: list[dict]) -> dict[str, float]:
    return {
        k: float(np.median([abs(r[f"err_{k}"]) for r in rows if r[f"err_{k}"] is not None]))
        for k in ("tpot_ms", "ttft_ms")
    }


def print_silicon(rows: list[dict], fit: ServingFit, label: str) -> None:
    ran = sum(r["err_tpot_ms"] is not None for r in rows)
    m = silicon_medians(rows)
    print(
        f"{label}: compute efficiency {fit.compute_efficiency:.4f}, memory efficiency {fit.memory_efficiency:.4f}, "
        f"step overhead {fit.step_overhead_s * 1e3:.3f} ms: {ran}/{len(rows)} rows simulated, mean |log error| "
        f"{silicon_loss(rows):.4f}, median |error| TPOT {m['tpot_ms']:.1f} %, TTFT {m['ttft_ms']:.1f} %"
    )
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"backend {r['row']['backend']}", []).append(r)
        groups.setdefault(f"model {r['row']['preset']}", []).append(r)
    for name, group in sorted(groups.items()):
        kept = [r for r in group if r["err_tpot_ms"] is not None]
        if kept:
            g = silicon_medians(kept)
            print(f"  {name:28s} {len(kept):>3d} rows: TPOT {g['tpot_ms']:6.1f} %, TTFT {g['ttft_ms']:6.1f} %")
    for r in rows:
        if r["reason"]:
            print(f"  not simulated: {r['row']['id']}: {r['reason']}")


def write_fit(fit: ServingFit, rows: list[dict], fitted_on: str | None = None) -> None:
    m = medians(rows)
    text = GPU_PERF_FILE.read_text()
    if fitted_on is None:
        fitted_on = (
            f"bench/gpu_cost_fit.py --fit on the {len(rows)} records of public_serving_benchmarks.yaml, "
            f"{time.strftime('%Y-%m-%d')}: median |error| output tok/s {m['output_tok_s']:.1f} %, TPOT "
            f"{m['tpot_ms']:.1f} %, TTFT {m['ttft_ms']:.1f} % (not fitted)"
        )
    block = (
        f"serving_fit:\n  compute_efficiency: {fit.compute_efficiency:.4f}\n"
        f"  memory_efficiency: {fit.memory_efficiency:.4f}\n  step_overhead_ms: {fit.step_overhead_s * 1e3:.4f}\n"
        f'  fitted_on: "{fitted_on}"\n'
    )
    GPU_PERF_FILE.write_text(re.sub(r"serving_fit:\n(  .*\n)+", block, text))


def print_public(cases: list[Case], fit: ServingFit) -> list[dict]:
    """The public records with ``fit``: each with the roofline, then the default step times' medians."""
    rows = evaluate(cases, fit, "roofline")
    print(f"\nthe {len(rows)} public records, roofline:")
    print_rows(rows, fit)
    m = medians(evaluate(cases, fit))
    print(
        f"default step times (silicon where covered, else the roofline): median |error| output tok/s "
        f"{m['output_tok_s']:.1f} %, TPOT {m['tpot_ms']:.1f} %, TTFT {m['ttft_ms']:.1f} %"
    )
    return rows


def fit_on_silicon(cases: list[Case], start: ServingFit, every: int, write: bool) -> None:
    """--fit-on silicon: fit on every ``every``-th row of silicon_h100.yaml, check on the public records."""
    all_rows = load_rows()
    rows = all_rows[::every]
    print(f"fitting on {len(rows)} of the {len(all_rows)} rows of {ROWS_FILE.name} (rows[::{every}]), roofline")
    started = time.perf_counter()
    objective, result = cached(lambda f: evaluate_silicon(rows, f), silicon_loss)
    objective(start)
    fit = fit_constants(objective, start)
    objective(fit)
    print(f"fit: {time.perf_counter() - started:.0f} s")
    (before_loss, before), (after_loss, after) = result(start), result(fit)
    print_silicon(before, start, "before")
    print_silicon(after, fit, "after")
    print("\nwith today's constants:")
    old_public = print_public(cases, start)
    print("\nwith the fitted constants:")
    public = print_public(cases, fit)
    if not write:
        return
    m, s, old = medians(public), silicon_medians(after), medians(old_public)
    if after_loss >= before_loss:
        print(f"not written: the fit does not lower the rows' loss ({after_loss:.4f} >= {before_loss:.4f})")
        return
    if max(m["output_tok_s"], m["tpot_ms"]) > MAX_PUBLIC_MEDIAN:
        print(
            f"not written: the public records' roofline medians (output tok/s {m['output_tok_s']:.1f} %, TPOT "
            f"{m['tpot_ms']:.1f} %) pass {MAX_PUBLIC_MEDIAN:.0f} % (today's: {old['output_tok_s']:.1f} %, "
            f"{old['tpot_ms']:.1f} %)"
        )
        return
    ran = sum(r["err_tpot_ms"] is not None for r in after)
    write_fit(
        fit,
        public,
        f"bench/gpu_cost_fit.py --fit-on silicon --every {every} on {ran} of the {len(all_rows)} H100-SXM rows of "
        f"silicon_h100.yaml (rows[::{every}]), roofline, {time.strftime('%Y-%m-%d')}: median |error| on those rows "
        f"TPOT {s['tpot_ms']:.1f} %, TTFT {s['ttft_ms']:.1f} %; on the {len(public)} public records of "
        f"public_serving_benchmarks.yaml (roofline, not fitted) output tok/s {m['output_tok_s']:.1f} %, TPOT "
        f"{m['tpot_ms']:.1f} %, TTFT {m['ttft_ms']:.1f} %",
    )
    print(f"written: {GPU_PERF_FILE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="search the three constants first")
    parser.add_argument("--fit-on", choices=("silicon",), help="fit on silicon_h100.yaml's rows instead")
    parser.add_argument("--every", type=int, default=10, help="with --fit-on silicon: fit on every K-th row")
    parser.add_argument("--write", action="store_true", help="with --fit or --fit-on: store them in gpu_perf.yaml")
    args = parser.parse_args()
    cases, fit = load_cases(), serving_fit()
    if args.fit_on == "silicon":
        fit_on_silicon(cases, fit, args.every, args.write)
        return
    if args.fit:
        objective, _ = cached(lambda f: evaluate(cases, f, "roofline"), loss)
        fit = fit_constants(objective, fit)
    rows = print_public(cases, fit)
    if args.fit and args.write:
        write_fit(fit, rows)
        print(f"written: {GPU_PERF_FILE}")


if __name__ == "__main__":
    main()
