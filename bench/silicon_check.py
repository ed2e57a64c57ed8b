"""kvplan simulate's GPU step times against measured serving runs on H100, beside aiconfigurator's own estimate.

The check set is tests/kvplan/data/silicon_h100.yaml: 760 measured serving runs on H100-SXM
(vLLM, SGLang, TRT-LLM; its header says where they come from and how they were chosen). Each row
is simulated as the source ran it: a random dataset of fixed ISL/OSL, a closed loop at the row's
concurrency, the row's TP (and expert parallel size), ``max_num_batched_tokens`` 8192 unless the
row says otherwise, ``max_num_seqs`` 1024 (vLLM V1's default on an 80 GB GPU), steady state (the
first wave of ``concurrency`` requests warms up; the next two waves are measured). kvplan's mean
TTFT and TPOT are compared with the measured ones (error % = predicted / measured - 1).

The peer, measured in the same run: aiconfigurator's ``cli estimate`` (its Python entry,
``aiconfigurator.cli.api.cli_estimate``, one process for all rows) on the same row, run from its
own virtual environment (``--peer-python``; made in a temporary folder with
``pip install aiconfigurator==0.12.0`` when not given; ``--no-peer`` skips it).

``--fit`` finds each backend's five silicon constants (kvplan.sizing.gpus.silicon.SiliconFit: decode and
prefill scales of the summed operation times, overheads per step, per sequence and per layer)
minimising the mean absolute log error of TPOT and TTFT over that backend's rows (four
simulations per row: see ``fit_backend``); ``--fit-every K`` fits on every K-th row only (the check still runs on
all); ``--write`` stores them in kvplan/sizing/data/silicon_fit.yaml. ``--step-times roofline``
checks the roofline instead.

    flock /tmp/kvplan-cpu.lock .venv/bin/python bench/silicon_check.py [--limit N] [--fit [--write]]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS_FILE = Path(__file__).resolve().parents[1] / "tests" / "kvplan" / "data" / "silicon_h100.yaml"
PEER = "aiconfigurator==0.12.0"


def load_rows(limit: int | None = None) -> list[dict]:
    import yaml

    rows = yaml.safe_load(ROWS_FILE.read_text())["rows"]
    if limit:
        step = max(len(rows) // limit, 1)
        rows = rows[::step][:limit]  # spread over the file (it is sorted by model and source)
    return rows


# the rows InferenceX measured (SILICON_PROTOCOL.md: their ``source`` names these exports); the
# others come from a pipeline whose protocol is not public
INFERENCEX_SOURCES = ("source_file=2026-03-25.csv", "source_file=2026-04-06.csv", "db-dump")
# --no-marlin: price a recipe's Marlin experts with the database's own kernel (the check before
# kvplan.sizing.gpus.silicon_marlin); set in main, read by the worker processes through the env
NO_MARLIN = os.environ.get("KVPLAN_SILICON_NO_MARLIN") == "1"
# --no-tokenizer: no tokenizer thread before vLLM's queue (the check before it), read as NO_MARLIN is
NO_TOKENIZER = os.environ.get("KVPLAN_SILICON_NO_TOKENIZER") == "1"
# InferenceX's warm-up (2 x C requests, drained) from this date on (commit d053ae24e)
WARMUP_FROM = date(2026, 1, 21)
MARLIN_FROM = date(2026, 1, 2)
# The engine flags of the InferenceX vLLM recipes that set the rows' engines, by (preset, GPU):
# github SemiAnalysisAI/InferenceX, benchmarks/70b_fp8_{h100,h200}_slurm.sh at 9596d23d7
# (2025-10-29), benchmarks/gptoss_fp4_{h100,h200}_slurm.sh at e06929c70 (2025-11-02) and 4e135fd3f
# (2025-12-08), benchmarks/single_node/gptoss_fp4_{h100,h200,b200}.sh at 79a42e20a (2026-03-27).
# Every one: --max-num-batched-tokens 8192, --no-enable-prefix-caching (random prompts share
# nothing either way); None: --max-num-seqs $CONC. moe_kernel marlin: the H100 gpt-oss recipes
# export VLLM_MXFP4_USE_MARLIN=1 from 2026-01-02 on (MARLIN_FROM: commit 4e52ed4c6, "Fix H100/H200
# perf regression", in benchmarks/gptoss_fp4_h100_{slurm,docker}.sh; kept in gptoss_fp4_h100.sh at
# b0c4ed21b and benchmarks/single_node/gptoss_fp4_h100.sh at d2c2acb19, cec542a9a, 626932a11), so
# vLLM ran the experts on Marlin; before it (af4ccd03f to 4e135fd3f) no recipe set it.
RECIPES: dict[tuple[str, str], dict[str, Any]] = {
    ("llama-3.1-70b", "H100-SXM"): {"max_num_seqs": None, "kv_cache_dtype": "fp8"},
    ("llama-3.1-70b", "H200"): {"max_num_seqs": None, "kv_cache_dtype": "fp8"},
    ("gpt-oss-120b", "H100-SXM"): {"max_num_seqs": None, "moe_kernel": "marlin"},
    ("gpt-oss-120b", "H200"): {"max_num_seqs": None},
    ("gpt-oss-120b", "B200"): {"max_num_seqs": 512, "kv_cache_dtype": "fp8"},
}


def row_source(row: dict) -> str:
    """``inferencex`` (protocol known: SILICON_PROTOCOL.md) or ``internal`` (not public)."""
    return "inferencex" if row["source"].startswith(INFERENCEX_SOURCES) else "internal"


def measured_on(row: dict) -> date | None:
    """The ``measured=`` date of the row's source field, if it has one."""
    for part in row["source"].split(";"):
        key, _, value = part.strip().partition("=")
        if key == "measured" and value:
            return date.fromisoformat(value[:10])
    return None


def row_replay(row: dict) -> dict[str, Any]:
    """How a row is replayed: its protocol (InferenceX's for its rows: lengths in [0.8 L, L], 10 x C
    requests, 2 x C drained warm-ups from WARMUP_FROM on; else fixed lengths, a wave of C
    requests of warm-up, two measured) and its engine flags (an InferenceX vLLM row's recipe where
    RECIPES has it, else max_num_batched_tokens 8192 and max_num_seqs 1024, vLLM V1's default on
    an 80 GB GPU), with ``said``: the replay in words, printed per row. InferenceX's client sends
    its random prompts as text to /v1/completions (SILICON_PROTOCOL.md), so a vLLM row's prompts
    queue for the API server's tokenizer thread first (kvplan.run.sim.cost.TextFrontEnd at vLLM's
    documented rate, the same for every such row; ``--no-tokenizer``: none)."""
    from kvplan.run.sim.cost import VLLM_TOKENIZE_US_PER_TOKEN

    c = row["batch_size"]
    flags: dict[str, Any] = {
        "max_num_seqs": max(1024, c),
        "max_num_batched_tokens": row.get("max_num_batched_tokens", 8192),
    }
    said = []
    if row_source(row) == "inferencex":
        day = measured_on(row)
        warm = 2 if day is not None and day >= WARMUP_FROM else 0
        protocol = {
            "kind": "inferencex",
            "random_range_ratio": 0.8,
            "num_prompts_per_concurrency": 10,
            "warmup_per_concurrency": warm,
        }
        said.append(f"inferencex 10xC{', warm-up 2xC' if warm else ', no warm-up'}")
        if row["backend"] == "vllm" and not NO_TOKENIZER:  # the client sends text: vLLM's API server tokenizes it
            flags["tokenize_us_per_token"] = VLLM_TOKENIZE_US_PER_TOKEN
            said.append(f"text prompts tokenized at {VLLM_TOKENIZE_US_PER_TOKEN:g} us/token")
        recipe = RECIPES.get((row["preset"], row["gpu"])) if row["backend"] == "vllm" else None
        if recipe is not None:
            flags["max_num_seqs"] = recipe["max_num_seqs"] or c
            said.append(f"recipe max_num_seqs {flags['max_num_seqs']}")
            if recipe.get("kv_cache_dtype") and not row["kv_cache_dtype"]:
                flags["kv_cache_dtype"] = recipe["kv_cache_dtype"]
                said.append(f"kv {recipe['kv_cache_dtype']}")
            if recipe.get("moe_kernel") and not NO_MARLIN and day is not None and day >= MARLIN_FROM:
                flags["moe_kernel"] = recipe["moe_kernel"]
                said.append(f"experts on {recipe['moe_kernel']}")
        else:
            said.append("engine defaults")
    else:
        protocol = None
        said.append("steady state, engine defaults")
    return {"protocol": protocol, "flags": flags, "said": "; ".join(said)}


def row_workload(row: dict):
    """The row's load as a workload (tiny-random-llama names the engine section; the GPU setup
    replaces its model and pool), replayed as ``row_replay`` says."""
    from kvplan.workload.file import parse_workload

    c, isl, osl = row["batch_size"], row["isl"], row["osl"]
    replay = row_replay(row)
    bucket: dict[str, Any] = {"name": "row", "input_tokens": isl, "output_tokens": osl, "concurrency": [c]}
    if replay["protocol"] is not None:
        bucket["protocol"] = replay["protocol"]
    else:
        bucket.update(num_requests=3 * c, warmup=c)
    flags = replay["flags"]
    data = {
        "name": "silicon-row",
        "engine": {
            "model": "tiny-random-llama",
            "max_num_seqs": flags["max_num_seqs"],
            "max_num_batched_tokens": flags["max_num_batched_tokens"],
            "max_model_len": isl + osl + 16,
        },
        "dataset": {"kind": "random"},
        "buckets": [bucket],
    }
    return parse_workload(data)


def simulate_row(args: tuple[dict, str, Any]) -> dict:
    """kvplan's mean TTFT and TPOT (ms) for one row, or the reason it could not simulate. The
    third element: the silicon fits by backend (a dict), or with ``roofline`` the roofline's
    constants (a kvplan.sizing.gpus.gpu_perf.ServingFit), or None for the stored ones."""
    row, step_times, fit = args
    from kvplan.errors import KvplanError
    from kvplan.run.sim.gpu_target import gpu_setup
    from kvplan.run.sim.run import sample
    from kvplan.run.sim.search import Prober
    from kvplan.sizing.gpus.gpu_perf import ServingFit
    from kvplan.sizing.gpus.silicon import SiliconFit

    started = time.perf_counter()
    out = {"id": row["id"]}
    try:
        workload = row_workload(row)
        roofline_fit = fit if isinstance(fit, ServingFit) and step_times == "roofline" else None
        silicon_fit = SiliconFit(*fit[row["backend"]]) if isinstance(fit, dict) and row["backend"] in fit else None
        setup = gpu_setup(
            workload,
            row["preset"],
            row["gpu"],
            row["tp"],
            kv_cache_dtype=row["kv_cache_dtype"] or row_replay(row)["flags"].get("kv_cache_dtype", "auto"),
            weight_dtype=row["weight_dtype"] or "auto",
            backend=row["backend"],
            ep=row.get("moe_ep_size") or 1,
            step_times="silicon" if step_times == "silicon" else "roofline",
            silicon_fit=silicon_fit,
            fit=roofline_fit,
            moe_kernel=row_replay(row)["flags"].get("moe_kernel", "auto"),
            tokenize_us_per_token=row_replay(row)["flags"].get("tokenize_us_per_token", 0.0),
        )
        bucket = workload.buckets[0]
        level = Prober(workload, setup.facts, setup.clock, sample(workload, setup.facts).requests).level(
            0, "closed", bucket.concurrency[0], plan=bucket.level_plan.at(bucket.concurrency[0])
        )
        if level is None or not level.ttft_ms or not level.tpot_ms:
            out["reason"] = "no finished requests"
        else:
            out.update(
                ttft_ms=level.ttft_ms.mean,
                tpot_ms=level.tpot_ms.mean,
                ttft_p50_ms=level.ttft_ms.p50,
                tpot_p50_ms=level.tpot_ms.p50,
                step_times=setup.cost_model.step_times,
            )
    except KvplanError as err:
        out["reason"] = f"{err.field}: {err.problem}"
    except Exception as err:  # a bench prints every row, with its reason
        out["reason"] = f"{type(err).__name__}: {err}"
    out["seconds"] = time.perf_counter() - started
    return out


PEER_SCRIPT = r"""
import json, logging, sys
logging.disable(logging.WARNING)
from aiconfigurator.cli.api import cli_estimate
for line in sys.stdin:
    job = json.loads(line)
    try:
        r = cli_estimate(job["model_path"], "h100_sxm", mode="agg", backend_name=job["backend"],
                         isl=job["isl"], osl=job["osl"], batch_size=job["batch_size"], tp_size=job["tp"],
                         moe_tp_size=job["moe_tp"], moe_ep_size=job["moe_ep"],
                         gemm_quant_mode=job["gemm"], moe_quant_mode=job["moe"])
        print(json.dumps({"id": job["id"], "ttft_ms": r.ttft, "tpot_ms": r.tpot}), flush=True)
    except BaseException as e:
        print(json.dumps({"id": job["id"], "reason": f"{type(e).__name__}: {str(e)[:200]}"}), flush=True)
"""


def peer_python(given: str | None) -> str:
    if given:
        return given
    folder = Path(tempfile.mkdtemp(prefix="aiconfigurator-peer-"))
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    subprocess.run([str(folder / "bin" / "pip"), "install", "-q", PEER], check=True)
    return str(folder / "bin" / "python")


def peer_rows(rows: list[dict], python: str) -> dict[str, dict]:
    """aiconfigurator's estimate of every row, by id (its quant modes as the row records them)."""
    from kvplan.sizing.gpus.silicon import match_model
    from kvplan.sizing.models.model_source import load_model_config

    jobs = []
    for row in rows:
        config = load_model_config(row["preset"])[0]
        # the row's quant modes; none for its default ("", bf16) and for fp4 rows, whose recorded
        # nvfp4 H100 has no kernels for (the checkpoint's own MXFP4 then applies, as for kvplan)
        quant = {"": None, "bf16": None, **({"nvfp4": None} if row["precision"] == "fp4" else {})}
        jobs.append(
            {
                "id": row["id"],
                "model_path": match_model(config, row["weight_dtype"] or "auto"),
                "backend": row["backend"],
                "isl": row["isl"],
                "osl": row["osl"],
                "batch_size": row["batch_size"],
                "tp": row["tp"],
                "moe_tp": row.get("moe_tp_size"),
                "moe_ep": row.get("moe_ep_size"),
                "gemm": quant.get(row["gemm_quant_mode"], row["gemm_quant_mode"]),
                "moe": quant.get(row["moe_quant_mode"], row["moe_quant_mode"]),
            }
        )
    done = subprocess.run(
        [python, "-c", PEER_SCRIPT],
        input="\n".join(json.dumps(j) for j in jobs),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            item = json.loads(line)
            out[item["id"]] = item
    return out


def err(pred: float | None, meas: float) -> float | None:
    return None if pred is None else (pred / meas - 1) * 100


def run_rows(rows: list[dict], step_times: str, fit: dict | None = None, jobs: int = 2) -> dict[str, dict]:
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(simulate_row, [(r, step_times, fit) for r in rows], chunksize=4))
    return {r["id"]: r for r in results}


def median_abs(values: list[float | None]) -> float | None:
    kept = [abs(v) for v in values if v is not None]
    return statistics.median(kept) if kept else None


def report(rows: list[dict], ours: dict[str, dict], peer: dict[str, dict] | None, verbose: bool = True) -> dict:
    """Print each row (``verbose``) and the median |error| % per source, backend and model and
    overall, kvplan's mean beside the peer's; then kvplan's mean and its median (P50) against the
    measured figure on the same groups (the source does not say which it is). Returns the
    medians by group."""
    fmt = lambda v, d=1: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    table = []
    if verbose:
        print(
            f"{'row':62s} {'TPOT meas':>9s} {'kvplan':>7s} {'err%':>6s} {'peer':>7s} {'err%':>6s} "
            f"{'TTFT meas':>10s} {'kvplan':>9s} {'err%':>6s} {'peer':>9s} {'err%':>6s}  replay | reason"
        )
    for row in rows:
        k = ours.get(row["id"], {})
        p = (peer or {}).get(row["id"], {})
        entry = {
            "source": row_source(row),
            "backend": row["backend"],
            "preset": row["preset"],
            "tpot": err(k.get("tpot_ms"), row["silicon_tpot_ms"]),
            "ttft": err(k.get("ttft_ms"), row["silicon_ttft_ms"]),
            "tpot_p50": err(k.get("tpot_p50_ms"), row["silicon_tpot_ms"]),
            "ttft_p50": err(k.get("ttft_p50_ms"), row["silicon_ttft_ms"]),
            "peer_tpot": err(p.get("tpot_ms"), row["silicon_tpot_ms"]),
            "peer_ttft": err(p.get("ttft_ms"), row["silicon_ttft_ms"]),
        }
        table.append(entry)
        if verbose:
            print(
                f"{row['id'][:62]:62s} {row['silicon_tpot_ms']:9.2f} {fmt(k.get('tpot_ms'), 2):>7s} "
                f"{fmt(entry['tpot'], 0):>6s} {fmt(p.get('tpot_ms'), 2):>7s} {fmt(entry['peer_tpot'], 0):>6s} "
                f"{row['silicon_ttft_ms']:10.1f} {fmt(k.get('ttft_ms')):>9s} {fmt(entry['ttft'], 0):>6s} "
                f"{fmt(p.get('ttft_ms')):>9s} {fmt(entry['peer_ttft'], 0):>6s}  {row_replay(row)['said']}"
                f"{' | ' + k['reason'] if k.get('reason') else ''}"
                f"{' | peer: ' + p['reason'] if p.get('reason') else ''}"
            )
    groups: dict[str, list[dict]] = {}
    for e in table:
        groups.setdefault(f"source {e['source']}", []).append(e)
    for e in table:
        groups.setdefault(f"backend {e['backend']}", []).append(e)
        groups.setdefault(f"model {e['preset']}", []).append(e)
    groups["all"] = table
    both = [e for e in table if e["tpot"] is not None and e["peer_tpot"] is not None]
    groups["all, rows both ran"] = both
    print(
        f"\nmedian |error| %          {'rows':>5s} {'kvplan TPOT':>12s} {'peer TPOT':>10s} "
        f"{'kvplan TTFT':>12s} {'peer TTFT':>10s}"
    )
    summary = {}
    keys = ("tpot", "ttft", "peer_tpot", "peer_ttft", "tpot_p50", "ttft_p50")
    for name, group in groups.items():
        m = {k: median_abs([e[k] for e in group]) for k in keys}
        ran = sum(e["tpot"] is not None for e in group)
        summary[name] = m
        print(
            f"{name:25s} {ran:>3d}/{len(group):<3d} {fmt(m['tpot']):>10s} {fmt(m['peer_tpot']):>10s} "
            f"{fmt(m['ttft']):>12s} {fmt(m['peer_ttft']):>10s}"
        )
    print(
        f"\nwhich statistic: median |error| % of kvplan's mean and of its median (P50)\n"
        f"{'':25s} {'rows':>7s} {'TPOT mean':>10s} {'TPOT P50':>9s} {'TTFT mean':>10s} {'TTFT P50':>9s}"
    )
    for name, m in summary.items():
        if name.startswith(("source", "backend")) or name == "all":
            ran = sum(e["tpot"] is not None for e in groups[name])
            print(
                f"{name:25s} {ran:>3d}/{len(groups[name]):<3d} {fmt(m['tpot']):>10s} {fmt(m['tpot_p50']):>9s} "
                f"{fmt(m['ttft']):>10s} {fmt(m['ttft_p50']):>9s}"
            )
    return summary


# the range each constant is searched in (SiliconFit's order: decode scale, prefill scale, step,
# sequence and layer overheads): the measured kernels are trusted to within -20 %/+25 % on decode
# steps and a factor of 2.5 on steps with prefill; overheads up to 5 ms per step, 0.2 ms per
# sequence, 0.1 ms per layer
BOUNDS = ((0.8, 1.25), (0.7, 2.5), (0.0, 5e-3), (0.0, 2e-4), (0.0, 1e-4))
# the simulations per row: one constant 1, the others 0 (the layer overhead's coefficient is the
# step overhead's times the model's layers: both add a fixed time to every step)
UNITS = ((1.0, 0.0, 0.0, 0.0), (0.0, 1.0, 0.0, 0.0), (0.0, 0.0, 1.0, 0.0), (0.0, 0.0, 0.0, 1.0))


def fit_backend(rows: list[dict], backend: str, jobs: int) -> tuple[float, ...]:
    """(decode scale, prefill scale, step overhead s, sequence overhead s, layer overhead s) of
    ``backend`` minimising the mean absolute log error of TPOT and TTFT over its rows (absolute, not squared:
    the check is on median errors, and a few rows queue far beyond what any step time explains).

    A closed loop with no think time schedules the same steps whatever they cost (a request is
    sent when one finishes and joins the next step), so each row's mean TTFT and TPOT are linear
    in the five constants. Four simulations per row, one per constant set to 1 and the others 0,
    give the coefficients (the layer overhead's is the step overhead's times the model's layers);
    the fit is then a search over five numbers (Nelder-Mead on their logistic transforms, scipy,
    from three starts) with no further simulation."""
    import numpy as np
    from scipy.optimize import minimize
    from scipy.special import expit

    from kvplan.sizing.models.model_source import load_model_config

    mine = [r for r in rows if r["backend"] == backend]
    parts = [run_rows(mine, "silicon", {backend: unit}, jobs) for unit in UNITS]
    terms = []  # (coefficient per constant..., measured) per row and metric
    for row in mine:
        got = [p[row["id"]] for p in parts]
        layers = load_model_config(row["preset"])[0]["num_hidden_layers"]
        for key, meas in (("tpot_ms", row["silicon_tpot_ms"]), ("ttft_ms", row["silicon_ttft_ms"])):
            if all(g.get(key) is not None for g in got):
                terms.append([g[key] for g in got] + [got[2][key] * layers, meas])
    arr = np.array(terms)

    low, high = np.array([b[0] for b in BOUNDS]), np.array([b[1] for b in BOUNDS])

    def constants(x: np.ndarray) -> np.ndarray:  # each within its BOUNDS (a logistic map)
        return low + (high - low) * expit(x)

    def loss(x: np.ndarray) -> float:
        pred = arr[:, :5] @ constants(x)
        return float(np.mean(np.abs(np.log(pred / arr[:, 5]))))

    best = None
    for start in ((0.0, 0.0, -2.0, -2.0, -2.0), (0.5, 0.5, -1.0, -3.0, -1.0), (-0.5, 1.0, 0.0, 0.0, 0.0)):
        found = minimize(
            loss, np.array(start), method="Nelder-Mead", options={"maxiter": 8000, "xatol": 1e-5, "fatol": 1e-7}
        )
        best = found if best is None or found.fun < best.fun else best
    fit = tuple(float(v) for v in constants(best.x))
    print(
        f"  {backend}: {len(mine)} rows, scales {fit[0]:.4f} (decode) {fit[1]:.4f} (prefill), overheads "
        f"{fit[2] * 1e3:.3f} ms per step {fit[3] * 1e3:.4f} ms per sequence {fit[4] * 1e3:.4f} ms per layer, "
        f"mean |log error| {best.fun:.4f}"
    )
    return fit


def write_fit(fits: dict[str, tuple[float, ...]], rows: list[dict], refit: list[str]) -> None:
    """Store ``fits`` in kvplan/sizing/data/silicon_fit.yaml (the backends not in ``refit`` keep
    their ``fitted_on``)."""
    from kvplan.sizing.gpus.silicon import FIT_FILE, silicon_fit

    counts = {b: sum(r["backend"] == b for r in rows) for b in fits}
    kept = {b: silicon_fit(b).fitted_on for b in fits if b not in refit}
    lines = [
        "# Per-backend corrections of kvplan.sizing.gpus.silicon's summed operation times: step seconds =",
        "# scale x (aiconfigurator-core's operation times, ms) / 1000 + step_overhead_ms / 1000",
        "#   + layer_overhead_ms / 1000 x the model's layers + seq_overhead_ms / 1000 x the step's",
        "#   sequences (scale: decode_scale on a decode-only step, prefill_scale on a step with prefill).",
        "# Fitted by bench/silicon_check.py --fit --write on tests/kvplan/data/silicon_h100.yaml",
        "# (measured H100-SXM serving runs from aiconfigurator-core 0.12.0's silicon_sample.csv,",
        "# Apache-2.0): each backend's five constants minimise the mean absolute log error of TPOT and",
        "# TTFT, each within the range bench/silicon_check.py's BOUNDS gives it.",
        "backends:",
    ]
    for backend, (decode, prefill, step, seq, layer) in sorted(fits.items()):
        lines += [
            f"  {backend}:",
            f"    decode_scale: {decode:.4f}",
            f"    prefill_scale: {prefill:.4f}",
            f"    step_overhead_ms: {step * 1e3:.4f}",
            f"    seq_overhead_ms: {seq * 1e3:.5f}",
            f"    layer_overhead_ms: {layer * 1e3:.5f}",
            f'    fitted_on: "{kept.get(backend) or f"{counts[backend]} H100-SXM rows of {backend}, {date.today()}"}"',
        ]
    FIT_FILE.write_text("\n".join(lines) + "\n")
    print(f"wrote {FIT_FILE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="check this many rows, spread over the file")
    parser.add_argument("--backend", help="check only this backend's rows")
    parser.add_argument("--source", choices=("inferencex", "internal"), help="check only this source's rows")
    parser.add_argument("--preset", help="check only this model's rows (a kvplan preset: gpt-oss-120b)")
    parser.add_argument("--step-times", choices=("silicon", "roofline"), default="silicon")
    parser.add_argument("--peer-python", help="python of a venv with aiconfigurator==0.12.0")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--fit", action="store_true")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--fit-every", type=int, default=1, help="fit on every K-th row")
    parser.add_argument("--backends", help="fit only these (comma-separated); the others keep their fit")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quiet", action="store_true", help="medians only")
    parser.add_argument(
        "--no-marlin", action="store_true", help="price recipes' Marlin MXFP4 experts with the database's own kernel"
    )
    parser.add_argument(
        "--no-tokenizer", action="store_true", help="no tokenizer thread before vLLM's queue on text-prompt rows"
    )
    args = parser.parse_args()
    if args.no_tokenizer:
        global NO_TOKENIZER
        NO_TOKENIZER = True
        os.environ["KVPLAN_SILICON_NO_TOKENIZER"] = "1"
    if args.no_marlin:
        global NO_MARLIN
        NO_MARLIN = True
        os.environ["KVPLAN_SILICON_NO_MARLIN"] = "1"
    rows = [
        r
        for r in load_rows(args.limit)
        if args.backend in (None, r["backend"])
        and args.source in (None, row_source(r))
        and args.preset in (None, r["preset"])
    ]
    print(
        f"bench/silicon_check.py, {date.today().isoformat()}, {platform.node()} ({os.cpu_count()} CPUs), "
        f"{len(rows)} rows of {ROWS_FILE.name}, step times: {args.step_times}"
    )
    if args.fit:
        fit_rows = rows[:: args.fit_every]
        wanted = sorted({r["backend"] for r in fit_rows} & set((args.backends or "vllm,sglang,trtllm").split(",")))
        from kvplan.sizing.gpus.silicon import silicon_fit

        fits = {
            b: (f.decode_scale, f.prefill_scale, f.step_overhead_s, f.seq_overhead_s, f.layer_overhead_s)
            for b in ("vllm", "sglang", "trtllm")
            if (f := silicon_fit(b)).fitted_on
        }
        fits.update({b: fit_backend(fit_rows, b, args.jobs) for b in wanted})
        print("fitted:", {b: tuple(round(v, 6) for v in f) for b, f in fits.items()})
        if args.write:
            write_fit(fits, fit_rows, wanted)
            from kvplan.sizing.gpus import silicon

            silicon._fits.cache_clear()
    started = time.perf_counter()
    peer = None
    if not args.no_peer:
        python = peer_python(args.peer_python)
        t = time.perf_counter()
        peer = peer_rows(rows, python)
        print(f"peer: aiconfigurator cli estimate on {len(rows)} rows in {time.perf_counter() - t:.0f} s")
    t = time.perf_counter()
    ours = run_rows(rows, args.step_times, None, args.jobs)
    print(f"kvplan: {len(rows)} rows simulated in {time.perf_counter() - t:.0f} s ({args.jobs} processes)")
    report(rows, ours, peer, verbose=not args.quiet)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
