"""`kvplan simulate` from the command line: no torch on its path, its JSON, report and gate on its
run folder, and one red line with exit 2 for every bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[4]
SMOKE = ROOT / "workloads" / "smoke.yaml"
CHAT = ROOT / "workloads" / "chat.yaml"
TORCH_FREE = """
import sys
from kvplan.cli import main
sys.argv = ["kvplan", *sys.argv[1:]]
try:
    main()
except SystemExit as done:
    assert not done.code, done.code
heavy = sorted(m for m in ("torch", "transformers", "triton", "accelerate") if m in sys.modules)
print("HEAVY", heavy)
"""


def run_fresh(*args: str) -> subprocess.CompletedProcess:
    """``kvplan ARGS`` in a fresh interpreter, printing which heavy packages it imported."""
    return subprocess.run(
        [sys.executable, "-c", TORCH_FREE, *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


@pytest.mark.smollm2
def test_simulating_chat_yaml_imports_neither_torch_nor_transformers(tmp_path):
    done = run_fresh("simulate", str(CHAT), "--out", str(tmp_path / "run"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "HEAVY []"
    result = json.loads((tmp_path / "run" / "results.json").read_text())
    assert result["source"] == "simulated" and result["cost_model"]["kind"] == "calibrated"
    assert result["run"]["torch"] is None and result["run"]["transformers"] is None


def test_simulating_a_gpu_imports_no_torch_and_prints_the_report_json(tmp_path):
    run_dir = tmp_path / "run"
    done = run_fresh(
        "simulate", str(SMOKE), "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--out", str(run_dir), "--json"
    )
    assert done.returncode == 0, done.stderr
    printed, heavy = done.stdout.rsplit("HEAVY", 1)
    assert heavy.strip() == "[]"
    simulated = json.loads(printed)
    assert simulated["source"] == "simulated"
    bucket = simulated["buckets"][0]
    for key in ("name", "knee", "slo_max_concurrency", "slo_max_request_rate", "levels"):
        assert key in bucket
    for key in (
        "mode",
        "level",
        "num_completed",
        "num_failed",
        "preemptions",
        "peak_used_blocks",
        "output_throughput_tok_s",
        "goodput_req_s",
        "ttft_ms",
        "tpot_ms",
        "itl_ms",
        "e2e_ms",
    ):
        assert key in bucket["levels"][0]
    assert set(bucket["levels"][0]["ttft_ms"]) == {"mean", "p50", "p95", "p99"}
    # Llama-3.1-8B on H100 is in aiconfigurator-core's database: measured step times, named per target
    from kvplan.sizing.gpus.silicon import default_version

    assert simulated["targets"][0]["step_times"] == f"silicon: h100_sxm / vllm {default_version('h100_sxm', 'vllm')}"
    # An 8B model's pool on an 80 GB GPU holds max_num_seqs (16) smoke requests at once: no knee.
    # The SLO still holds at 16 in flight, and past it (users wait in the queue) up to where the
    # wait breaks it: the answer is no longer capped by the bucket's 8 requests.
    assert bucket["knee"] is None and bucket["slo_max_concurrency"] > 16
    capacity = bucket["slo_capacity"]
    best, above = capacity["max_concurrency"], capacity["above_concurrency"]
    assert (
        best["level"] == bucket["slo_max_concurrency"] < above["level"] <= max(best["level"] * 1.02, best["level"] + 1)
    )
    assert best["slo_attainment"] >= 0.95 > above["slo_attainment"]
    # no rate past what max_num_seqs in flight serve is sustainable: the rate is finite
    assert capacity["burst_meets_slo"] is False and bucket["slo_max_request_rate"] > 0
    assert capacity["max_request_rate"]["slo_attainment"] >= 0.95
    # `kvplan report DIR --json` prints the same object from the saved run.
    code, out, err = run_cli("report", str(run_dir), "--json")
    assert (code, err) == (0, "") and json.loads(out) == simulated


def test_report_and_gate_read_a_simulated_run_unchanged(tmp_path, smoke_run):
    run_dir = tmp_path / "sim"
    code, out, err = run_cli("simulate", str(SMOKE), "--calibrate", str(smoke_run), "--out", str(run_dir), "--quiet")
    # smoke.yaml's plan entry is an L4, which aiconfigurator-core's database lacks: one line says so
    roofline = f"warning: {SMOKE}: plan[0]: Llama-3.1-8B-Instruct on L4 timed by the roofline: no vllm data for l4"
    # (and a busy machine may have slowed the measured run part-way: the calibration's drift warnings,
    # in any order beside it: the smoke run is measured on this machine while other tests run)
    lines = err.splitlines()
    assert code == 0 and sum(line.startswith(roofline) for line in lines) == 1, err
    assert all("the machine slowed down part-way" in line for line in lines if not line.startswith(roofline)), err
    assert out.strip() == f"report: {run_dir}"
    code, out, err = run_cli("report", str(run_dir))
    assert (code, err) == (0, "") and (run_dir / "kv_over_time.png").is_file()
    baseline = tmp_path / "baseline.yaml"
    assert run_cli("gate", str(run_dir), "--baseline", str(baseline), "--update-baseline")[0] == 0
    code, out, _ = run_cli("gate", str(run_dir), "--baseline", str(baseline))
    assert code == 0 and out.splitlines()[-1].endswith("0 failed")


@pytest.mark.parametrize(
    "args, line",
    [
        (["--model", "llama-3.1-8b", "--gpu", "X100"], "error: --gpu: unknown GPU 'X100'; use one of A100-40GB, "),
        (
            ["--model", "llama-3.1-8b", "--gpu", "A10G"],
            "error: --gpu: no FLOP/s or bandwidth figures for A10G; use one of A100-40GB, ",
        ),
        (["--model", "llama-3.1-8b"], "error: --gpu: --model needs --gpu too"),
        (["--tp", "2"], "error: --tp: applies to a simulated GPU only"),
        (["--attainment", "1.5"], "error: --attainment: must be in (0, 1] (got 1.5)"),
        (["--model", "no-such-model", "--gpu", "H100-SXM"], "error: --model: unknown model 'no-such-model'"),
        (
            ["--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--backend", "tgi"],
            "error: --backend: unknown backend 'tgi'; use one of vllm, sglang, trtllm",
        ),
        (["--backend", "sglang"], "error: --backend: applies to a simulated GPU only"),
        (
            ["--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--backend-version", "0.0.1"],
            "error: --backend-version: aiconfigurator-core has no vllm 0.0.1 data for h100_sxm; use one of ",
        ),
        (
            ["--model", "smollm2-135m", "--gpu", "H100-SXM", "--step-times", "silicon"],
            "error: --step-times: no measured step times for SmolLM2-135M",
        ),
        (["--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--step-times", "exact"], "error: --step-times: unknown"),
        # --ep is checked whatever times the steps (the roofline splits experts too)
        (
            ["--model", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--tp", "4", "--ep", "3", "--step-times", "roofline"],
            "error: --ep: must divide tp = 4 (got 3); give 1 or a divisor of tp",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--tp", "2", "--ep", "2"],
            "error: --ep: Llama-3.1-8B-Instruct has no experts to split (got 2); leave ep at 1 for a dense model",
        ),
        (
            ["--model", "mixtral-8x7b", "--gpu", "H100-SXM", "--tp", "16", "--ep", "16", "--step-times", "roofline"],
            "error: --ep: must divide Mixtral-8x7B-Instruct-v0.1's 8 experts (got 16); give a divisor of both",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--ep", "4"],  # tp 1: the dense model is the problem
            "error: --ep: Llama-3.1-8B-Instruct has no experts to split (got 4)",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "L4", "--backend", "sglang", "--backend-version", "9.9.9"],
            "error: --backend-version: aiconfigurator-core has no sglang data for this GPU (got 9.9.9); leave it out:"
            " the roofline times this GPU",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--backend-version", " "],
            "error: --backend-version: is empty; give a database version, or leave it out",
        ),
        # the capacity arithmetic's fix names simulate's own options (it has no --pp or --kv-memory-gib)
        (
            ["--model", "llama-3.1-405b", "--gpu", "L4"],
            "error: KV budget: weights 755.96 GiB + overhead 2.00 GiB = 757.96 GiB exceed 22.03 GiB x 0.9 = 19.83 GiB"
            " by 738.13 GiB; use a larger --gpu, more --tp, or a smaller --weight-dtype",
        ),
    ],
)
def test_bad_options_get_one_line_and_exit_2(args, line):
    code, out, err = run_cli("simulate", str(SMOKE), *args)
    assert code == 2 and out == "" and err.startswith(line) and err.count("\n") == 1, err


def test_a_calibration_of_another_engine_is_refused_by_the_field(tmp_path, smoke_run):
    other = tmp_path / "bf16.yaml"
    other.write_text(SMOKE.read_text().replace("dtype: float32", "dtype: bfloat16"))
    code, out, err = run_cli("simulate", str(other), "--calibrate", str(smoke_run))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {other}: engine.dtype: is bfloat16, the calibration ({smoke_run} (smoke, ")
    assert "ran float32; calibrate on a load test of this engine (--calibrate), or simulate a GPU" in err
    code, _, err = run_cli("simulate", str(SMOKE), "--calibrate", str(tmp_path / "nothing"))
    assert code == 2 and err.startswith(f"error: {tmp_path / 'nothing'}: no results.json here")


@pytest.mark.parametrize("option", ["--calibrate", "--replay"])
@pytest.mark.parametrize(
    ("name", "cut", "problem"),
    [
        ("steps.jsonl", None, "missing"),
        ("steps.jsonl", 1, "holds 1 steps, results.json counts"),
        ("requests.jsonl", None, "missing"),
    ],
)
def test_a_run_folder_with_records_missing_or_cut_is_refused(tmp_path, smoke_run, option, name, cut, problem):
    # once: --replay of a run without steps.jsonl simulated no level and exited 0 (an empty report);
    # --calibrate on 1 of its steps said "too few to fit", without steps.jsonl "older than the fields"
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(smoke_run, broken)
    records = broken / name
    if cut is None:
        records.unlink()
    else:
        records.write_text("".join(records.read_text().splitlines(keepends=True)[:cut]))
    code, out, err = run_cli("simulate", str(SMOKE), option, str(broken), "--out", str(tmp_path / "sim"))
    assert code == 2 and not (tmp_path / "sim").exists(), err
    assert err.count("\n") == 1 and err.startswith(f"error: {records}: {problem}"), err
    assert err.rstrip().endswith("; restore it from the run, or pass a run folder whose records are whole"), err


def test_a_target_the_database_lacks_falls_back_to_the_roofline_with_one_line(tmp_path):
    """SmolLM2-135M is no model of aiconfigurator-core's: the roofline times it, and says why."""
    run_dir = tmp_path / "run"
    code, out, err = run_cli(
        "simulate", str(SMOKE), "--model", "smollm2-135m", "--gpu", "H100-SXM", "--out", str(run_dir), "--json"
    )
    assert code == 0 and err.count("\n") == 2, err
    fallback, unplanned = err.splitlines()
    assert fallback.startswith(f"warning: {SMOKE}: engine: SmolLM2-135M")
    assert "timed by the roofline: no aiconfigurator model config has this model's shape" in fallback
    assert unplanned == (
        f"warning: {SMOKE}: 1 plan: entry not simulated: --model/--gpu simulates that target alone; drop it to"
        " answer for them"
    )
    (target,) = json.loads(out)["targets"]
    assert {k: target[k] for k in ("step_times", "weight_dtype", "ep", "backend")} == {
        "step_times": "roofline",
        "weight_dtype": "auto",
        "ep": 1,
        "backend": "vllm",
    }


def test_a_gpu_targets_json_names_its_backend_weights_and_experts(tmp_path):
    """A MoE target on SGLang with fp8 weights, split two ways; --step-times in any case."""
    code, out, err = run_cli(
        "simulate",
        str(SMOKE),
        *("--model", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--tp", "2", "--ep", "2"),
        *("--backend", "SGLang", "--weight-dtype", "FP8", "--step-times", "Auto"),
        *("--out", str(tmp_path / "run"), "--json"),
    )
    assert code == 0, err
    (target,) = json.loads(out)["targets"]
    assert target["step_times"].startswith("silicon: h100_sxm / sglang ")
    assert (target["weight_dtype"], target["ep"], target["backend"], target["tp"]) == ("fp8", 2, "sglang", 2)


def test_a_models_path_is_the_shells_and_a_hugging_face_id_is_an_id(tmp_path, monkeypatch):
    """--model cfg.json is read from the current folder, not the workload's; an id with a slash
    names the preset it aliases."""
    from kvplan.sizing.models.model_source import load_model_config

    (tmp_path / "work").mkdir()
    workload = tmp_path / "work" / "smoke.yaml"
    workload.write_text(SMOKE.read_text())
    (tmp_path / "cfg.json").write_text(json.dumps(load_model_config("llama-3.1-8b")[0]))
    monkeypatch.chdir(tmp_path)
    for i, model in enumerate(("cfg.json", "meta-llama/Llama-3.1-8B-Instruct")):
        code, out, err = run_cli(
            "simulate", "work/smoke.yaml", "--model", model, "--gpu", "H100-SXM", "--out", f"run{i}", "--json"
        )
        assert code == 0, err
        assert json.loads(out)["targets"][0]["step_times"].startswith("silicon: h100_sxm / vllm ")


def test_a_plan_entry_without_speed_figures_is_skipped_with_one_line(tmp_path):
    """A10G is in the GPU table for its memory, without FLOP/s or bandwidth: no capacity answers
    for it, and a line says so (the L4 entry is still answered, by the roofline)."""
    workload = tmp_path / "smoke.yaml"
    entry = "  - {model: llama-3.1-8b, gpu: L4, kv_cache_dtype: fp8}\n"
    assert entry in SMOKE.read_text()
    workload.write_text(SMOKE.read_text().replace(entry, entry + "  - {model: llama-3.1-8b, gpu: A10G}\n"))
    code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / "run"), "--json")
    assert code == 0, err
    assert f"warning: {workload}: plan[1]: no FLOP/s or bandwidth figures for A10G; no capacity answers for it" in (
        err.splitlines()
    )
    assert [t["target"] for t in json.loads(out)["targets"]] == ["engine", "plan[0]"]


def test_an_engine_limit_the_gpu_model_refuses_names_the_engine_section(tmp_path):
    """A simulation sets max_model_len by the workload's engine section (it has no such option):
    the error names that field, in that file."""
    workload = tmp_path / "smoke.yaml"
    workload.write_text(SMOKE.read_text().replace("  block_size: 4\n", "  block_size: 4\n  max_model_len: 1000000\n"))
    code, out, err = run_cli("simulate", str(workload), "--model", "llama-3.1-8b", "--gpu", "H100-SXM")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err == (
        f"error: {workload}: engine.max_model_len: 1,000,000 exceeds the model's limit of 131,072 tokens"
        " (max_position_embeddings); give at most 131072\n"
    )


def test_a_plan_entry_names_its_backend_and_expert_parallel_size(tmp_path):
    workload = tmp_path / "smoke.yaml"
    entry = "  - {model: llama-3.1-8b, gpu: L4, kv_cache_dtype: fp8}\n"
    moe = "  - {model: qwen3-30b-a3b, gpu: H100-SXM, tp: 2, ep: 2, backend: SGLang, weight_dtype: fp8}\n"
    workload.write_text(SMOKE.read_text().replace(entry, entry + moe))
    code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / "run"), "--json")
    assert code == 0, err
    target = json.loads(out)["targets"][2]
    assert target["target"] == "plan[1]" and target["step_times"].startswith("silicon: h100_sxm / sglang ")
    assert (target["ep"], target["backend"], target["tp"], target["weight_dtype"]) == (2, "sglang", 2, "fp8")
    for i, (good, bad, line) in enumerate(
        (
            (
                "backend: SGLang",
                "backend: tgi",
                "plan[1].backend: unknown backend 'tgi'; use one of vllm, sglang, trtllm",
            ),
            ("ep: 2", "ep: 3", "plan[1].ep: must divide tp = 2 (got 3)"),
            ("model: qwen3-30b-a3b", "model: ''", "plan[1].model: the model name is empty"),
            (
                "model: qwen3-30b-a3b, gpu: H100-SXM, tp: 2, ep: 2",
                "model: llama-3.1-70b, gpu: L4, tp: 1, ep: 1",
                # the entry's fp8 weights: half the 131.42 GiB of bf16 Llama-3.1-70B
                "plan[1]: weights 65.71 GiB + overhead 2.00 GiB = 67.71 GiB exceed 22.03 GiB x 0.9 = 19.83 GiB by"
                " 47.88 GiB; use a larger gpu, a higher tp or a smaller weight_dtype in this plan entry",
            ),
        )
    ):
        workload.write_text(SMOKE.read_text().replace(entry, entry + moe.replace(good, bad)))
        code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / f"bad{i}"))
        assert code == 2 and out == "" and err.startswith(f"error: {workload}: {line}"), err


def test_a_prompt_over_the_models_own_limit_is_told_to_shrink(tmp_path):
    """falcon-7b takes 2,048 tokens (its max_position_embeddings): no engine setting raises
    that, so the fix is the bucket's."""
    workload = tmp_path / "long.yaml"
    workload.write_text(SMOKE.read_text().replace("input_tokens: [12, 20]", "input_tokens: 4000"))
    code, out, err = run_cli("simulate", str(workload), "--model", "falcon-7b", "--gpu", "H100-SXM")
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == (
        f"error: {workload}: buckets[0].input_tokens: the longest request (4000 + 12 = 4012 tokens) exceeds the"
        " engine's max_model_len 2048 (by default the smaller of the KV pool's tokens and the model's"
        " max_position_embeddings); lower it: the model takes at most 2048 tokens"
    )


def test_a_bucket_no_request_of_which_fits_is_refused_before_its_prompts_are_drawn(tmp_path):
    # input_tokens 16,000,000 on smoke's 48 blocks of 4: once 8 prompts of 16 M random token ids drawn
    # (over 30 s) before the fit check refused them; now refused from the lengths alone
    import time

    import yaml

    data = yaml.safe_load(SMOKE.read_text())
    data["buckets"][0]["input_tokens"] = 16_000_000
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(data))
    start = time.perf_counter()
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "sim"))
    assert time.perf_counter() - start < 10 and code == 2 and not (tmp_path / "sim").exists(), err
    # ceil((16,000,000 + 12 - 1) / 4) = 4,000,003 blocks
    assert err.splitlines()[-1] == (
        f"error: {path}: buckets[0].input_tokens: the longest request (16000000 + 12 tokens) needs 4000003"
        " blocks of 4 tokens, the KV pool has 48; lower it or grow engine.num_blocks"
    )


def test_simulate_collects_at_the_simulation_thresholds_and_other_commands_at_pythons(monkeypatch, tmp_path):
    """``kvplan simulate`` (as ``plan`` and ``advise``) raises the collector's thresholds for its
    process (kvplan.cli.app.GC_THRESHOLDS); other commands, a load test's among them (whose client
    loop a large young collection would pause), keep CPython's; run_cli puts them back after."""
    import gc
    import importlib

    cli_app = importlib.import_module("kvplan.cli.app")  # the module (kvplan.cli.app is also the Typer app's name)
    before, seen = gc.get_threshold(), []
    monkeypatch.setattr(cli_app.gc, "set_threshold", lambda *t: seen.append(t))
    code, _, err = run_cli("estimate", "--model", "llama-3.1-8b", "--gpu", "H100-SXM")
    assert code == 0, err
    assert cli_app.GC_THRESHOLDS not in seen  # (run_cli's own putting back is the one call)
    run_dir = tmp_path / "run"
    code, _, err = run_cli(
        "simulate", str(SMOKE), "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--out", str(run_dir), "--quiet"
    )
    assert code == 0, err
    assert seen.count(cli_app.GC_THRESHOLDS) == 1 and cli_app.GC_THRESHOLDS[0] > before[0] == gc.get_threshold()[0]
