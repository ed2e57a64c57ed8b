"""The control for bench/silicon_disagg_check.py: the same models, GPUs, backends and benchmark,
aggregated (one pool), so that an error of the disaggregated replay can be told apart from an error
of the step times both share.

The rows: aiconfigurator-core 0.12.0's measured sample (the PyPI package, Apache-2.0, file
``aiconfigurator_core/systems/silicon_sample.csv``, as bench/silicon_disagg_extract.py reads it),
filtered to the aggregated runs of the disaggregated check's main model on its Hopper and Blackwell
GPUs that kvplan can replay alone:

- ``mode`` agg; model_path deepseek-ai/DeepSeek-V3 or -R1 (kvplan preset deepseek-v3); system
  b200_sxm or h200_sxm (kvplan B200, H200); precision fp8 (weights fp8);
- attention_dp_size 1 (blank taken as 1); tp_size 8 with moe_tp_size x moe_ep_size = 8 (blank:
  moe_tp the tp, moe_ep 1), one node without attention DP;
- ISL 1,024 or 8,192, OSL 1,024, concurrency at most 64 (minutes on 2 CPUs); both TTFT and TPOT
  present;
- from the source the disaggregated rows come from, InferenceX's database dump (``db-dump/``;
  ../shared/SILICON_PROTOCOL.md; replayed as bench/silicon_check.py replays its InferenceX rows).
  The sample's 2026-04-06 export measures some of the same points again a week later with a later
  TensorRT-LLM (1.2.0rc6.post3 against post2), at about half the TPOT on B200;
- one row per measurement: a run (its source field, which names the config and the concurrency,
  its lengths and its two results) listed twice is kept once.

Each row is simulated twice: with the backend's silicon fit (kvplan/sizing/data/silicon_fit.yaml,
fitted on H100 rows: how ``kvplan simulate`` times an aggregated replica) and with the operation
times alone (how a disaggregated pool is timed: docs/simulate.md). The peer, in the same run:
aiconfigurator's own aggregated estimate of each row (``cli_estimate(..., mode="agg")`` with the
row's system, parallelism and quant modes as the source records them) from its own venv
(``--peer-python``; made first, in a temporary folder with ``pip install aiconfigurator==0.12.0``,
when not given; ``--no-peer`` skips it).

Prints the date and the machine; per row the measured mean TTFT (ms) and TPOT (ms) and each
estimate's error (predicted / measured - 1, %); per backend and estimate the median |error| and
the median signed error of each, over the rows that estimate answered (the row counts differ where
one gave no answer); the seconds each side took; then one line per row an estimate did not answer,
with its reason.

    .venv/bin/python bench/silicon_agg_control.py [--jobs 2] [--csv PATH] [--peer-python PY | --no-peer]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.silicon_check import peer_python, simulate_row  # noqa: E402
from bench.silicon_disagg_check import estimates  # noqa: E402

GPUS = {"b200_sxm": "B200", "h200_sxm": "H200"}
MODELS = ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1")
SOURCES = ("db-dump",)  # InferenceX's database dump, the disaggregated check's source (SILICON_PROTOCOL.md)
UNFITTED = (1.0, 1.0, 0.0, 0.0, 0.0)  # decode scale, prefill scale, step, sequence, layer overheads


def default_csv() -> Path:
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"


def _given(value: object, kind: type) -> object:
    """A CSV cell as ``kind``, None where it is blank (NaN)."""
    return None if value != value else kind(value)  # NaN is the one value not equal to itself


def load_rows(csv: Path) -> list[dict]:
    """The control rows (module docstring) in bench/silicon_check.py's row format."""
    import pandas as pd

    d = pd.read_csv(csv)
    keep = (
        (d["mode"] == "agg")
        & d.model_path.isin(MODELS)
        & d.system.isin(list(GPUS))
        & (d.precision == "fp8")
        & (d.attention_dp_size.fillna(1) == 1)
        & (d.tp_size == 8)
        & (d.moe_tp_size.fillna(d.tp_size) * d.moe_ep_size.fillna(1) == d.tp_size)
        & d.isl.isin([1024, 8192])
        & (d.osl == 1024)
        & (d.batch_size <= 64)
        & d.silicon_data_source.astype(str).str.startswith(SOURCES)
        & d.silicon_ttft_ms.notna()
        & d.silicon_tpot_ms.notna()
    )
    same = ["silicon_data_source", "isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms"]  # one measurement
    rows = []
    for _, r in d[keep].drop_duplicates(subset=same).iterrows():
        rows.append(
            {
                "id": r.id,
                "source": str(r.silicon_data_source),
                "backend": r.backend,
                "preset": "deepseek-v3",
                "gpu": GPUS[r.system],
                "tp": int(r.tp_size),
                "moe_ep_size": int(r.moe_ep_size) if r.moe_ep_size == r.moe_ep_size else 1,
                "kv_cache_dtype": "",
                "weight_dtype": "fp8",
                "isl": int(r.isl),
                "osl": int(r.osl),
                "batch_size": int(r.batch_size),
                "silicon_ttft_ms": float(r.silicon_ttft_ms),
                "silicon_tpot_ms": float(r.silicon_tpot_ms),
                "model_path": r.model_path,
                "system": r.system,
                # as the source records them (None: blank), for the peer
                "source_parallel": {k: _given(r[k], int) for k in ("moe_tp_size", "moe_ep_size")},
                "source_quant": {k: _given(r[k], str) for k in ("gemm_quant_mode", "moe_quant_mode")},
            }
        )
    return sorted(rows, key=lambda r: (r["backend"], r["gpu"], r["isl"], r["batch_size"]))


def peer_rows(rows: list[dict], python: str) -> dict[str, dict]:
    """aiconfigurator's aggregated estimate (``cli_estimate``, mode agg) of every row, by id, with
    the row's system, parallelism and quant modes as the source records them."""
    jobs = [
        {
            "id": row["id"],
            "model_path": row["model_path"],
            "system": row["system"],
            "backend_name": row["backend"],
            "isl": row["isl"],
            "osl": row["osl"],
            "batch_size": row["batch_size"],
            "tp_size": row["tp"],
            **row["source_parallel"],
            **row["source_quant"],
        }
        for row in rows
    ]
    return estimates(jobs, python, "agg")


def _simulate(job: tuple[dict, bool]) -> dict:
    row, fitted = job
    return simulate_row((row, "silicon", None if fitted else {row["backend"]: UNFITTED}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--csv", type=Path, help="silicon_sample.csv (default: the installed aiconfigurator-core's)")
    parser.add_argument("--peer-python", help="python of a venv with aiconfigurator==0.12.0 (default: made)")
    parser.add_argument("--no-peer", action="store_true")
    args = parser.parse_args()
    rows = load_rows(args.csv or default_csv())
    python = None if args.no_peer else peer_python(args.peer_python)  # first: a failed install loses nothing
    print(f"{date.today()} on {platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}): {len(rows)} rows")
    started = time.perf_counter()
    jobs = [(row, fitted) for fitted in (True, False) for row in rows]
    with ProcessPoolExecutor(args.jobs) as pool:
        outs = list(pool.map(_simulate, jobs))
    ours_s, started = time.perf_counter() - started, time.perf_counter()
    peer = {} if python is None else peer_rows(rows, python)
    peer_s = time.perf_counter() - started
    errors: dict[tuple[str, str], list[tuple[float, float]]] = {}
    print("backend GPU     ISL   C  TTFT meas    fit  unfit   peer  TPOT meas    fit  unfit   peer")
    for i, row in enumerate(rows):
        cells = []
        for kind, out in (("fit", outs[i]), ("unfit", outs[len(rows) + i]), ("peer", peer.get(row["id"], {}))):
            if "ttft_ms" not in out:
                cells.append(None)
                continue
            pair = (out["ttft_ms"] / row["silicon_ttft_ms"] - 1, out["tpot_ms"] / row["silicon_tpot_ms"] - 1)
            errors.setdefault((row["backend"], kind), []).append(pair)
            cells.append(pair)
        pct = lambda c, k: "-" if c is None else f"{c[k] * 100:+.0f}%"  # noqa: E731
        print(
            f"{row['backend']:7} {row['gpu']:5} {row['isl']:5} {row['batch_size']:3}  {row['silicon_ttft_ms']:9.0f}"
            f" {pct(cells[0], 0):>6} {pct(cells[1], 0):>6} {pct(cells[2], 0):>6}  {row['silicon_tpot_ms']:9.2f}"
            f" {pct(cells[0], 1):>6} {pct(cells[1], 1):>6} {pct(cells[2], 1):>6}"
        )
    print("\nmedian %             rows  |TTFT|  TTFT signed  |TPOT|  TPOT signed")
    for (backend, kind), pairs in sorted(errors.items()):
        ttft, tpot = [p[0] * 100 for p in pairs], [p[1] * 100 for p in pairs]
        med = statistics.median
        print(
            f"{backend:7} {kind:6} {len(pairs):10}  {med(map(abs, ttft)):6.1f}  {med(ttft):+11.1f}"
            f"  {med(map(abs, tpot)):6.1f}  {med(tpot):+11.1f}"
        )
    print(f"kvplan: {len(jobs)} simulations in {ours_s:.0f} s ({args.jobs} processes)", end="")
    print("" if python is None else f"; the peer: {len(rows)} estimates in {peer_s:.0f} s")
    named = [
        ("kvplan, fit", outs[: len(rows)]),
        ("kvplan, unfit", outs[len(rows) :]),
        ("the peer", list(peer.values())),
    ]
    for who, answers in named:
        for o in answers:
            if "ttft_ms" not in o:
                print(f"no answer from {who}: {o['id']}: {o.get('reason', '')[:160]}")


if __name__ == "__main__":
    main()
