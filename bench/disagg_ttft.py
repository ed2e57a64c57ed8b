"""Chat TTFT aggregated against disaggregated on the bundled engine: workloads/disagg.yaml (ShareGPT
chats with long documents, SmolLM2-135M) through ``kvplan loadtest``'s run twice, once with its
``engine.disagg`` dropped (one aggregated engine) and once as written (1 prefill + 1 decode worker
in this process), the same requests at the same arrival times.

Prints per level and class the TTFT P50 and P99 (ms) of each run, the chat TPOT P50, and the
median measured KV copy (``kv_transfer_s``) of the disaggregated run; draws chat's P50 and P99
TTFT of every run (``--png``). Run it under the CPU lock; ``--repeat``
runs (default 2) go one after the other.

    .venv/bin/python bench/disagg_ttft.py [--png docs/img/disagg_chat_ttft.png] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def class_stats(result, name: str) -> dict[float, tuple[float, float, float]]:
    """Request rate -> (TTFT P50, TTFT P99, TPOT P50) in ms of class ``name`` in each mixed level."""
    out = {}
    for lv in (lv for lv in result.levels if len(lv.classes) > 1):  # the mixed levels, not a class alone
        for c in lv.classes:
            if c.name == name and c.ttft_ms is not None and c.tpot_ms is not None:
                out[lv.level] = (c.ttft_ms.p50, c.ttft_ms.p99, c.tpot_ms.p50)
    return out


def main() -> None:
    from kvplan.results.run_result import load_run
    from kvplan.run.loadtest import run_loadtest
    from kvplan.workload.file import load_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=str(ROOT / "workloads" / "disagg.yaml"))
    parser.add_argument("--png", default=None, help="where to draw chat TTFT against the request rate")
    parser.add_argument("--out", default=None, help="a folder for the run folders (default: a temporary one)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each, one after the other")
    args = parser.parse_args()
    disagg = load_workload(args.workload)
    assert disagg.engine.disagg is not None, "the workload must have engine.disagg"
    aggregated = disagg.model_copy(update={"engine": disagg.engine.model_copy(update={"disagg": None})})
    out = Path(args.out or tempfile.mkdtemp(prefix="disagg_ttft-"))
    reps = []
    for rep in range(1, args.repeat + 1):
        runs = {}
        for label, workload in (("aggregated", aggregated), ("disaggregated", disagg)):
            runs[label] = load_run(run_loadtest(workload, out / f"{label}-{rep}"))
            print(f"run {rep} {label}: {runs[label].run_dir}")
        report(runs)
        reps.append(runs)
    if args.png:
        plot(reps, Path(args.png))


def report(runs: dict) -> None:
    """Print each class's TTFT and TPOT, aggregated -> disaggregated, and the KV copies."""
    for cls in ("chat", "doc"):
        stats = {label: class_stats(run.result, cls) for label, run in runs.items()}
        for rate in sorted(stats["aggregated"]):
            (a50, a99, at), (d50, d99, dt) = stats["aggregated"][rate], stats["disaggregated"][rate]
            print(
                f"{cls} at {rate:g} req/s: TTFT P50 {a50:.0f} -> {d50:.0f} ms, P99 {a99:.0f} -> {d99:.0f} ms;"
                f" TPOT P50 {at:.1f} -> {dt:.1f} ms (aggregated -> disaggregated)"
            )
    moved = [r.kv_transfer_s for r in runs["disaggregated"].requests if r.kv_transfer_s is not None]
    print(f"KV copy per request (disaggregated): median {statistics.median(moved) * 1e3:.2f} ms over {len(moved)}")


def plot(reps: list[dict], png: Path) -> None:
    """Chat's TTFT P50 and P99 at each request rate, aggregated and disaggregated, a bar per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted(class_stats(reps[0]["aggregated"].result, "chat"))
    fig, axes = plt.subplots(1, len(rates), figsize=(max(6.0, 4.5 * len(rates)), 3.6), squeeze=False)
    width = 0.8 / (2 * len(reps))
    for ax, rate in zip(axes[0], rates):
        for k, (label, color) in enumerate((("aggregated", "tab:blue"), ("disaggregated", "tab:orange"))):
            for r, runs in enumerate(reps):
                p50, p99, _ = class_stats(runs[label].result, "chat")[rate]
                x = (k * len(reps) + r) * width - 0.4 + width / 2
                bars = ax.bar([x, 1 + x], [p50, p99], width, color=color, alpha=1 - 0.35 * r)
                bars.set_label(f"{label}, run {r + 1}")
                ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks([0, 1], ["chat TTFT P50", "chat TTFT P99"])
        ax.set_ylabel("ms")
        ax.set_title(f"{rate:g} req/s, chats and documents mixed", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M, shared 2-core CPU: 1 engine vs 1 prefill + 1 decode worker", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"chart: {png}")


if __name__ == "__main__":
    main()
