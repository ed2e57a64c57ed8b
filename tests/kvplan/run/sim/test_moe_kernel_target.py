"""``moe_kernel`` of a plan entry: ``marlin`` times a gpt-oss target's experts on Marlin
(kvplan.sizing.gpus.silicon_marlin), ``auto`` keeps the database's own kernel; bad values are one
line and exit 2."""

from pathlib import Path

import pytest

from kvplan.run.sim.cost import StepWork
from kvplan.run.sim.gpu_target import plan_setups
from kvplan.sizing.gpus import silicon
from kvplan.sizing.models.model_source import load_model_config
from kvplan.workload.file import load_workload
from tests.kvplan.cli_runner import run_cli

pytest.importorskip("aiconfigurator_core")

ROOT = Path(__file__).resolve().parents[4]
SMOKE = ROOT / "workloads" / "smoke.yaml"
ENTRY = "  - {model: llama-3.1-8b, gpu: L4, kv_cache_dtype: fp8}\n"


def _with(tmp_path: Path, *entries: str) -> Path:
    workload = tmp_path / "w.yaml"
    workload.write_text(SMOKE.read_text().replace(ENTRY, ENTRY + "".join(f"  - {e}\n" for e in entries)))
    return workload


@pytest.mark.parametrize(
    ("entry", "line"),
    [
        ("{model: gpt-oss-120b, gpu: H100-SXM, tp: 4, moe_kernel: cutlass}", "plan[1].moe_kernel: unknown MoE kernel"),
        ("{model: llama-3.1-8b, gpu: H100-SXM, moe_kernel: marlin}", "plan[1].moe_kernel: marlin prices MXFP4 experts"),
    ],
)
def test_bad_moe_kernels_get_one_line_and_exit_2(tmp_path, entry, line):
    workload = _with(tmp_path, entry)
    code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / "run"))
    assert code == 2 and out == "" and line in err and err.count("\n") == 1, err


def test_a_marlin_entry_times_its_steps_with_marlin_experts(tmp_path):
    workload = load_workload(
        _with(
            tmp_path,
            "{model: gpt-oss-120b, gpu: H100-SXM, tp: 4}",
            "{model: gpt-oss-120b, gpu: H100-SXM, tp: 4, moe_kernel: marlin}",
        )
    )
    setups, _ = plan_setups(workload)
    auto, marlin = setups[1], setups[2]
    config = load_model_config("gpt-oss-120b")[0]
    costs = {k: silicon.silicon_cost(config, "h100_sxm", 4, moe_kernel=k) for k in ("auto", "marlin")}
    assert "MXFP4 experts on Marlin" in marlin.cost_model.description
    assert "Marlin" not in auto.cost_model.description
    for work in (StepWork(0, 16, 0, 16 * 1024, 16 * 1024, 16 * 1024), StepWork(2048, 0, 1, 2048, 2048 * 2049 // 2, 0)):
        assert auto.clock().step_end(0.0, work) == pytest.approx(costs["auto"].step_seconds(work), rel=1e-12)
        assert marlin.clock().step_end(0.0, work) == pytest.approx(costs["marlin"].step_seconds(work), rel=1e-12)
        assert costs["marlin"].step_seconds(work) != pytest.approx(costs["auto"].step_seconds(work), rel=1e-3)
