"""Extract the disaggregated serving runs of aiconfigurator-core's measured sample into kvplan's check set.

The source: the PyPI package aiconfigurator-core 0.12.0 (Apache-2.0), file
``aiconfigurator_core/systems/silicon_sample.csv`` (5,221 rows; 1,602 with ``mode`` disagg). Kept:
the 274 disaggregated rows that describe both pools (``prefill_batch_size`` present: workers,
tensor, attention-data and expert parallelism, and batch of each pool); the other 1,328 give the
pools' parallelism only, without the workers or the batch, so a replay would have to guess them.
Nothing is changed: every kept number is the source's fact; ``replay`` adds why kvplan cannot
replay a row yet ("" where it can), decided from the row alone:

- a model with no kvplan preset (Kimi-K2.5);
- NVFP4 weights on a GPU without FP4 kernels in aiconfigurator-core's database (none here: the
  fp4 rows are all Blackwell) are left to the simulator, which says so per row.

Writes tests/kvplan/data/silicon_disagg.yaml (its header says the above)::

    .venv/bin/python bench/silicon_disagg_extract.py [--csv PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "kvplan" / "data" / "silicon_disagg.yaml"

# model_path -> kvplan preset (as tests/kvplan/data/silicon_h100.yaml maps them)
PRESETS = {
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1": "deepseek-v3",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "nvidia/Qwen3-32B-NVFP4": "qwen3-32b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
}
# aiconfigurator system -> kvplan GPU (kvplan/sizing/data/gpu_perf.yaml's silicon_system)
GPUS = {
    "h100_sxm": "H100-SXM",
    "h200_sxm": "H200",
    "b200_sxm": "B200",
    "b300_sxm": "B300",
    "gb200": "GB200",
    "gb300": "GB300",
}
POOL = ("num_workers", "batch_size", "tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")


def source_csv() -> Path:
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"


def concurrency(source: str) -> int | None:
    m = re.search(r"silicon_concurrency=(\d+)", source)
    return int(m.group(1)) if m else None


def pool(row: pd.Series, role: str) -> dict[str, int]:
    out = {}
    for key in POOL:
        value = row[f"{role}_{key}"]
        out[key.removeprefix("num_").removesuffix("_size")] = int(value) if pd.notna(value) else 0
    return out


def blocker(row: pd.Series, pre: dict, dec: dict) -> str:
    if row["model_path"] not in PRESETS:
        return f"no kvplan preset for {row['model_path']}"
    return ""


def extract(csv: Path) -> tuple[list[dict], str]:
    digest = hashlib.sha256(csv.read_bytes()).hexdigest()[:16]
    frame = pd.read_csv(csv)
    kept = frame[(frame["mode"] == "disagg") & frame["prefill_batch_size"].notna()]
    rows = []
    for _, row in kept.iterrows():
        pre, dec = pool(row, "prefill"), pool(row, "decode")
        rows.append(
            {
                "id": row["id"],
                "source": row["silicon_data_source"],
                "backend": row["backend"],
                "backend_version": "" if pd.isna(row["backend_version"]) else str(row["backend_version"]),
                "model_path": row["model_path"],
                "preset": PRESETS.get(row["model_path"], ""),
                "system": row["system"],
                "gpu": GPUS[row["system"]],
                "precision": row["precision"],
                "gemm_quant_mode": row["gemm_quant_mode"],
                "moe_quant_mode": row["moe_quant_mode"],
                "isl": int(row["isl"]),
                "osl": int(row["osl"]),
                "concurrency": concurrency(row["silicon_data_source"])
                or dec["batch"] * dec["workers"] * max(dec["attention_dp"], 1),
                "prefill": pre,
                "decode": dec,
                "silicon_ttft_ms": float(row["silicon_ttft_ms"]),
                "silicon_tpot_ms": float(row["silicon_tpot_ms"]),
                "replay": blocker(row, pre, dec),
            }
        )
    return rows, f"{len(frame)} rows, sha256 {digest}"


HEADER = """\
# Measured disaggregated serving runs, from the PyPI package aiconfigurator-core 0.12.0 (Apache-2.0):
# file aiconfigurator_core/systems/silicon_sample.csv ({what}), reduced by
# bench/silicon_disagg_extract.py. The numbers are the source's facts.
# Filter: mode disagg and prefill_batch_size present (the rows that give both pools' workers and
#   batch): {n} of the source's 1,602 disaggregated rows.
# Fields: id, source (silicon_data_source), backend, backend_version, model_path, preset (kvplan's;
#   "" = none), system, gpu (kvplan's name), precision, gemm_quant_mode, moe_quant_mode, isl, osl,
#   concurrency (the source's silicon_concurrency; where it gives none, decode batch x decode
#   workers x decode attention DP, as ../shared/SILICON_PROTOCOL.md says C is made), prefill and
#   decode: {{workers, batch, tp, attention_dp, moe_tp, moe_ep}} (0 = blank in the source),
#   silicon_ttft_ms, silicon_tpot_ms (ms, as measured), replay ("" = kvplan can replay it; else
#   why not, decided from the row alone).
# {replayable} rows have replay "".
rows:
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, help="the source CSV (default: the installed aiconfigurator-core's)")
    args = parser.parse_args()
    rows, what = extract(args.csv or source_csv())
    replayable = sum(not r["replay"] for r in rows)
    text = HEADER.format(what=what, n=len(rows), replayable=replayable)
    text += "".join(f"  - {json.dumps(r)}\n" for r in rows)
    OUT.write_text(text)
    print(f"{len(rows)} rows ({replayable} replayable) -> {OUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
