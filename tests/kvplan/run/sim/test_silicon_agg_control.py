"""bench/silicon_agg_control.py's rows: the filter its docstring states, on a CSV written here in
the source's columns (aiconfigurator-core's silicon_sample.csv)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from bench.silicon_agg_control import load_rows  # noqa: E402

KEPT = {
    "id": "kept",
    "silicon_data_source": "db-dump/2026-04-27; config_id=1; silicon_concurrency=4",
    "backend": "sglang",
    "model_path": "deepseek-ai/DeepSeek-R1",
    "system": "b200_sxm",
    "precision": "fp8",
    "gemm_quant_mode": "fp8_block",
    "moe_quant_mode": float("nan"),  # blank
    "mode": "agg",
    "isl": 1024,
    "osl": 1024,
    "batch_size": 4.0,
    "tp_size": 8.0,
    "attention_dp_size": float("nan"),  # blank: taken as 1
    "moe_tp_size": 8.0,
    "moe_ep_size": float("nan"),  # blank: 1
    "silicon_ttft_ms": 183.0,
    "silicon_tpot_ms": 8.75,
}
# each breaks one rule of the filter (and is another measurement: its own TTFT, so that no row
# is dropped as a repeat of another)
LEFT_OUT = {
    "disagg": {"mode": "disagg"},
    "other model": {"model_path": "Qwen/Qwen3-32B"},
    "other GPU": {"system": "h100_sxm"},
    "fp4": {"precision": "fp4"},
    "attention DP": {"attention_dp_size": 8.0},
    "tp 4": {"tp_size": 4.0, "moe_tp_size": 4.0},
    "experts 8 x 8": {"moe_tp_size": 8.0, "moe_ep_size": 8.0},
    "ISL 4000": {"isl": 4000},
    "OSL 8192": {"osl": 8192},
    "128 users": {"batch_size": 128.0},
    "other source": {"silicon_data_source": "source_file=2026-04-06.csv; model=DeepSeek-R1"},
    "no TTFT": {"silicon_ttft_ms": float("nan")},
    "no TPOT": {"silicon_tpot_ms": float("nan")},
}


def test_the_filter_keeps_one_row_per_measurement(tmp_path: Path) -> None:
    rows = [KEPT, {**KEPT, "id": "kept again"}]  # the same measurement under a second id
    for i, (name, change) in enumerate(LEFT_OUT.items()):
        rows.append({**KEPT, "id": name, "silicon_ttft_ms": 200.0 + i, **change})
    h200 = {"id": "h200 trtllm", "backend": "trtllm", "system": "h200_sxm", "moe_tp_size": 1.0, "moe_ep_size": 8.0}
    rows.append({**KEPT, **h200, "silicon_data_source": "db-dump/2026-04-27; config_id=2; silicon_concurrency=4"})
    path = tmp_path / "silicon_sample.csv"
    pd.DataFrame(rows).to_csv(path, index=False)

    got = load_rows(path)

    assert [r["id"] for r in got] == ["kept", "h200 trtllm"]  # sorted by backend, GPU
    first = got[0]
    assert (first["preset"], first["gpu"], first["tp"], first["moe_ep_size"], first["batch_size"]) == (
        "deepseek-v3",
        "B200",
        8,
        1,
        4,
    )
    assert (first["weight_dtype"], first["silicon_ttft_ms"], first["silicon_tpot_ms"]) == ("fp8", 183.0, 8.75)
    assert (got[1]["gpu"], got[1]["moe_ep_size"]) == ("H200", 8)
    # the source's own fields, blanks as None, for the peer (aiconfigurator's cli_estimate)
    assert (first["model_path"], first["system"]) == ("deepseek-ai/DeepSeek-R1", "b200_sxm")
    assert first["source_parallel"] == {"moe_tp_size": 8, "moe_ep_size": None}
    assert first["source_quant"] == {"gemm_quant_mode": "fp8_block", "moe_quant_mode": None}


def test_each_rule_alone_leaves_its_row_out(tmp_path: Path) -> None:
    """Each row of LEFT_OUT is left out by its own rule: alone beside KEPT, only KEPT is kept."""
    for i, (name, change) in enumerate(LEFT_OUT.items()):
        path = tmp_path / f"{i}.csv"
        pd.DataFrame([KEPT, {**KEPT, "id": name, "silicon_ttft_ms": 300.0, **change}]).to_csv(path, index=False)
        assert [r["id"] for r in load_rows(path)] == ["kept"], name
