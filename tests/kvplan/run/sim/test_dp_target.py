"""``dp`` on a GPU target: ``--dp`` of ``kvplan simulate``, ``dp:`` of a plan entry and of each
disaggregated pool, bad values one line and exit 2; and the measured disaggregated rows that use
attention data parallelism parse into pools with their dp."""

import json
import sys
from pathlib import Path

import pytest

from kvplan.run.sim.gpu_target import disagg_setup
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[4]
SMOKE = ROOT / "workloads" / "smoke.yaml"
ENTRY = "  - {model: llama-3.1-8b, gpu: L4, kv_cache_dtype: fp8}\n"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--model", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--dp", "0"],
            "error: --dp: must be >= 1 (got 0); give 1, or the DP ranks of each engine instance",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--dp", "2"],
            "error: --dp: Llama-3.1-8B-Instruct has no experts for its 2 DP ranks to share (got 2); leave dp at 1",
        ),
        (["--dp", "2"], "error: --dp: applies to a simulated GPU only"),
        (
            ["--model", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--tp", "2", "--dp", "2", "--ep", "3"],
            "error: --ep: must divide tp x dp = 4 (got 3); give 1 or a divisor of tp x dp",
        ),
    ],
)
def test_bad_dp_options_get_one_line_and_exit_2(args, line):
    code, out, err = run_cli("simulate", str(SMOKE), *args)
    assert code == 2 and out == "" and err.startswith(line) and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("entry", "line"),
    [
        ("{model: qwen3-30b-a3b, gpu: H100-SXM, dp: 0}", "plan[1].dp: must be >= 1 (got 0)"),
        ("{model: llama-3.1-8b, gpu: H100-SXM, dp: 2}", "plan[1].dp: Llama-3.1-8B-Instruct has no experts"),
        (
            "{model: llama-3.1-8b, gpu: H100-SXM, disagg: {decode: {dp: 2}}}",
            "plan[1].disagg.decode.dp: Llama-3.1-8B-Instruct has no experts",
        ),
        ("{model: qwen3-30b-a3b, gpu: H100-SXM, disagg: {prefill: {dp: 0}}}", "plan[1].disagg.prefill.dp: must be"),
    ],
)
def test_bad_dp_entries_get_one_line_and_exit_2(tmp_path, entry, line):
    workload = tmp_path / "w.yaml"
    workload.write_text(SMOKE.read_text().replace(ENTRY, ENTRY + f"  - {entry}\n"))
    code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / "run"))
    assert code == 2 and out == "" and err.startswith(f"error: {workload}: {line}"), err


def test_a_plan_entry_with_dp_is_simulated_on_tp_x_dp_gpus(tmp_path):
    workload = tmp_path / "w.yaml"
    entry = "  - {model: qwen3-30b-a3b, gpu: H100-SXM, tp: 1, dp: 2, ep: 2, backend: vllm}\n"
    workload.write_text(SMOKE.read_text().replace(ENTRY, ENTRY + entry))
    code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / "run"), "--json")
    assert code == 0, err
    target = json.loads(out)["targets"][2]
    assert (target["target"], target["tp"], target["dp"], target["ep"]) == ("plan[1]", 1, 2, 2)
    assert target["step_times"].startswith("silicon: h100_sxm / vllm ")


def test_the_measured_rows_with_attention_dp_parse_into_pools_with_their_dp():
    sys.path.insert(0, str(ROOT))
    from bench.silicon_disagg_check import load_rows, row_workload

    rows = load_rows()
    with_dp = [r for r in rows if max(r["prefill"]["attention_dp"], r["decode"]["attention_dp"]) > 1]
    assert len(with_dp) == 196
    assert all(r["replay"] == "" or r["replay"].startswith("no kvplan preset") for r in with_dp)
    for row in with_dp:
        if row["replay"]:
            continue
        disagg = row_workload(row).plan[0].disagg
        assert (disagg.prefill.dp, disagg.decode.dp) == (
            max(row["prefill"]["attention_dp"], 1),
            max(row["decode"]["attention_dp"], 1),
        )
        assert disagg.decode.max_num_seqs == row["decode"]["batch"]  # per DP rank
    # one row sized: 1 prefill worker tp 1 x dp 8 and 1 decode worker tp 1 x dp 8 on B200
    row = next(r for r in with_dp if r["id"] == "dsr1_b200_trtllm_fp8_disagg_8192x1024_c128_cfg666")
    workload = row_workload(row)
    setup = disagg_setup(workload, workload.plan[0], "plan[0]")
    assert setup.disagg == "1P tp1 dp8 + 1D tp1 dp8 over rdma-400g, first token from decode"
    assert setup.facts.max_num_seqs == 16 * 8  # the decode batch 16 on each of 8 DP ranks
