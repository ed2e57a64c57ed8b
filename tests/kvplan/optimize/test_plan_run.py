"""Where and how ``kvplan plan`` runs: Ray tasks on a local Ray instance give the very answers of
the search here and of the process pool; the run folder is re-rendered by ``kvplan report`` from
plan.json alone; Ctrl-C keeps the configurations that finished."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[3]
CHAT = ROOT / "workloads" / "chat.yaml"
# 2 GPU kinds x 2 TP x 2 max_num_seqs: 8 configurations, 4 chunks, ~10 s here
SMALL = ["--model", "llama-3.1-8b", "--rate", "20", "--gpus", "L4,H100-SXM", "--tp", "1,2", "--max-num-seqs", "64,256"]


def plan(tmp: Path, name: str, *args: str) -> dict:
    code, out, err = run_cli("plan", str(CHAT), *SMALL, *args, "--json", "--out", str(tmp / name))
    assert code == 0, err
    return json.loads(out)


def in_child(*args: str, env: dict | None = None) -> tuple[int, str, str]:
    """``kvplan ARGS`` in a child process: Ray's client leaves native (gRPC) threads in the process
    that called ray.init, even after ray.shutdown, and a later test's fork (the capacity searches:
    kvplan.run.sim.run.search_beside, .ahead) could then deadlock in its child."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "kvplan"), *args],
        capture_output=True,
        text=True,
        env={**(env if env is not None else os.environ), "COLUMNS": "200"},
        timeout=600,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def here(tmp_path_factory):
    return plan(tmp_path_factory.mktemp("plan"), "here", "--jobs", "1")


def test_ray_tasks_give_the_answers_of_the_search_here(here, tmp_path):
    pytest.importorskip("ray", reason="the cluster extra: pip install 'kvplan[cluster]' (make test installs it)")
    code, out, err = in_child(
        "plan", str(CHAT), *SMALL, "--ray", "local", "--jobs", "2", "--json", "--out", str(tmp_path / "ray")
    )
    assert code == 0, err
    on_ray = json.loads(out)
    pooled = plan(tmp_path, "pool", "--jobs", "2")
    assert len(here["configs"]) == 8 and here["best"]["meets_slo"]
    assert on_ray["configs"] == here["configs"] == pooled["configs"]  # every number, in the same order
    assert on_ray["best"] == here["best"] and not on_ray["interrupted"]


def test_no_ray_cluster_is_one_line(tmp_path):
    pytest.importorskip("ray", reason="the cluster extra")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    code, _, err = in_child("plan", str(CHAT), *SMALL, "--ray", "auto", "--out", str(tmp_path / "run"), env=env)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "ray: no Ray cluster answers at 'auto'" in err, err


def test_report_rebuilds_the_run_folder_from_plan_json(here, tmp_path):
    run_dir = tmp_path / "run"
    code, out, err = run_cli("plan", str(CHAT), *SMALL, "--jobs", "1", "--out", str(run_dir))
    assert code == 0, err
    saved = json.loads((run_dir / "plan.json").read_text())
    assert saved["configs"] == here["configs"] and saved["num_configs"] == 8 and saved["bucket"] == "short"
    summary = (run_dir / "summary.md").read_text()
    best = saved["best"]
    assert f"--tensor-parallel-size {best['tp']} --max-num-seqs {best['max_num_seqs']}" in summary
    table = [line for line in summary.splitlines() if line.startswith("| 1 |")]
    assert table and f"| {best['gpu']} | {best['tp']} |" in table[0]
    frame = pd.read_csv(run_dir / "configs.csv")
    assert list(frame["gpu"]) == [c["gpu"] for c in saved["configs"]]
    assert list(frame["slo_max_concurrency"]) == [c["slo_max_concurrency"] for c in saved["configs"]]
    for view in ("summary.md", "configs.csv", "pareto.png"):
        (run_dir / view).unlink()
    code, out, err = run_cli("report", str(run_dir))
    assert code == 0, err
    assert (run_dir / "summary.md").read_text() == summary
    assert (run_dir / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pd.read_csv(run_dir / "configs.csv").equals(frame)
    code, out, err = run_cli("report", str(run_dir), "--json")
    assert code == 0 and json.loads(out) == saved, err
    code, _, err = run_cli("report", str(run_dir), "--compare", str(run_dir))
    assert code == 2 and "compare" in err and len(err.strip().splitlines()) == 1


def test_ctrl_c_keeps_the_configurations_that_finished(tmp_path):
    run_dir = tmp_path / "run"
    # 8 chunks (4 GPU kinds x 2 TP) on 2 workers: SIGINT after the first finishes leaves some unrun
    args = ["--model", "llama-3.1-8b", "--rate", "20", "--gpus", "L4,H100-SXM,A100-80GB,H200", "--tp", "1,2"]
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "kvplan"), "plan", str(CHAT), *args, "--jobs", "2", "--out", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the first finished configuration's progress line
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert " x" in first and "req/s per replica" in first, first + rest + err
    assert proc.returncode == 130, err
    saved = json.loads((run_dir / "plan.json").read_text())
    finished = len(saved["configs"])
    assert saved["interrupted"] and saved["num_configs"] == 8 and 1 <= finished < 8
    assert f"interrupted: {finished} of 8 configurations finished, kept in {run_dir}" in err
    assert "Traceback" not in err
    progress = [line for line in (first + rest).splitlines() if "req/s per replica" in line or "infeasible" in line]
    assert len(progress) == finished  # one line per finished configuration, and only those


def test_the_library_call_gives_the_command_s_answer_and_plan_json_has_a_versioned_schema(here, tmp_path):
    """plan_deployments(PlanRequest) is what `kvplan plan` runs: the same configurations, every number;
    its plan.json validates against `kvplan schema plan`; one without schema_version reads as 1 and
    one from a newer kvplan is refused in one line."""
    import jsonschema

    from kvplan.optimize.plan_run import PlanRequest, plan_deployments

    request = PlanRequest(
        workload=CHAT,
        model="llama-3.1-8b",
        rate=20.0,
        gpus=("L4", "H100-SXM"),
        tp=(1, 2),
        max_num_seqs=(64, 256),
        out=tmp_path / "lib",
    )
    seen = []

    from contextlib import contextmanager

    @contextmanager
    def progress(total):
        seen.append(total)
        yield lambda r: seen.append(r.gpu)

    outcome = plan_deployments(request, progress)
    run = outcome.run.model_dump(mode="json")
    assert run["configs"] == here["configs"] and run["best"] == here["best"] and run["schema_version"] == 1
    assert seen[0] == 8 and sorted(seen[1:]) == sorted(c["gpu"] for c in here["configs"])
    saved = json.loads((outcome.run_dir / "plan.json").read_text())
    code, out, err = run_cli("schema", "plan")
    assert code == 0, err
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(saved)
    assert set(schema["properties"]) >= {"schema_version", "load", "slo", "configs", "best"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate({**saved, "configs": [{"gpu": "L4"}]})

    old = {k: v for k, v in saved.items() if k != "schema_version"}
    (outcome.run_dir / "plan.json").write_text(json.dumps(old))
    code, out, err = run_cli("report", str(outcome.run_dir), "--json")
    assert code == 0 and json.loads(out) == saved, err
    (outcome.run_dir / "plan.json").write_text(json.dumps({**saved, "schema_version": 99}))
    code, _, err = run_cli("report", str(outcome.run_dir))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "schema_version: is 99, newer than" in err, err
