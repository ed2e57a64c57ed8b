"""`pip install .` alone (no engine extra): what the base install promises works in an interpreter
where every package that only the engine extra adds cannot be imported (as after a plain
`pip install .`), and what needs the engine says so in one line."""

import json
import os
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from kvplan.results.run_result import load_run
from tests.kvplan.run.server.fake_server import FakeServer, Options
from tests.kvplan.sizing.test_layer_kinds import write_gguf

ROOT = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower()


def engine_only_modules() -> set[str]:
    """Top-level modules of the distributions the engine and silicon extras add and the base does
    not declare."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    extra = {_name(r) for r in extras["engine"] + extras["silicon"]} - base
    modules = {
        module
        for module, dists in packages_distributions().items()
        if any(d.lower().replace("_", "-") in extra for d in dists)
    }
    assert {"torch", "transformers", "triton", "aiconfigurator_core"} <= modules
    return modules


PROGRAM = """
import contextlib, io, json, sys, importlib.abc
REFUSED = set(json.loads(sys.argv[1]))
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Refuse())
from kvplan.cli import main
answers = []
for args in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ['kvplan', *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as done:
            code = done.code or 0
    answers.append([code, out.getvalue(), err.getvalue()])
answers.append(sorted({m.split('.')[0] for m in sys.modules} & REFUSED))
print(json.dumps(answers))
"""


def test_the_base_install_estimates_reports_gates_and_load_tests_a_server(tmp_path):
    gguf = write_gguf(
        tmp_path / "m.gguf",
        "llama",
        block_count=2,
        embedding_length=64,
        attention__head_count=4,
        attention__head_count_kv=2,
        attention__key_length=16,
        attention__value_length=16,
        context_length=4096,
    )
    workload = tmp_path / "w.yaml"
    workload.write_text(
        json.dumps(
            {
                "name": "t",
                "seed": 0,
                "dataset": "random",
                "slo": {"ttft_ms": 5000},
                "buckets": [
                    {
                        "name": "short",
                        "input_tokens": [8, 16],
                        "output_tokens": 6,
                        "concurrency": [1, 2],
                        "num_requests": 4,
                    }
                ],
                "target": {"vocab_size": 512, "scrape_interval_ms": 20},
            }
        )
    )
    run, baseline, sim = tmp_path / "run", tmp_path / "baseline.yaml", tmp_path / "sim"
    server = FakeServer(Options(interval_s=0.001)).start()
    try:
        commands = [
            ["estimate", "--model", str(gguf), "--json"],
            ["estimate", "--model", "llama-3.1-8b", "--json"],
            [
                "loadtest",
                str(workload),
                "--target",
                server.url,
                "--model",
                "llama-3.1-8b",
                "--out",
                str(run),
                "--quiet",
            ],
            ["report", str(run), "--json"],
            ["gate", str(run), "--baseline", str(baseline), "--update-baseline"],
            ["gate", str(run), "--baseline", str(baseline)],
            ["schema", "results"],
            ["loadtest", "workloads/smoke.yaml", "--quiet"],  # the bundled engine: not in the base
            # a GPU without aiconfigurator-core: the roofline times it, and one line says why
            ["simulate", "workloads/smoke.yaml", "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--out", str(sim)],
        ]
        done = subprocess.run(
            [sys.executable, "-c", PROGRAM, json.dumps(sorted(engine_only_modules())), json.dumps(commands)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    *answers, imported = json.loads(done.stdout.splitlines()[-1])
    assert [code for code, _, _ in answers] == [0, 0, 0, 0, 0, 0, 0, 2, 0], answers
    assert answers[8][2] == (
        "warning: workloads/smoke.yaml: engine: Llama-3.1-8B-Instruct on H100-SXM timed by the roofline: "
        "aiconfigurator-core is not installed (pip install 'kvplan[silicon]')\n"
        "warning: workloads/smoke.yaml: 1 plan: entry not simulated: --model/--gpu simulates that target alone; "
        "drop it to answer for them\n"
    )
    assert json.loads((sim / "results.json").read_text())["cost_model"]["step_times"] == "roofline"
    # GGUF read by kvplan.sizing.models.gguf_reader (no gguf package): 2 layers x 2 KV heads x (16 + 16) x 2 bytes
    # (f16, llama.cpp's cache type)
    assert json.loads(answers[0][1])["bytes_per_token"] == 2 * 2 * (16 + 16) * 2
    # a preset: Llama-3.1-8B, 32 layers x 8 KV heads x (128 + 128) x 2 bytes (bf16)
    assert json.loads(answers[1][1])["bytes_per_token"] == 32 * 8 * 256 * 2 == 131_072
    assert load_run(run).result.status == "complete" and len(load_run(run).requests) == 8
    summary = json.loads(answers[3][1])
    assert summary["source"] == "target" and summary["server"]["num_gpu_blocks"] == 48
    assert "passed, 0 failed" in answers[5][1]
    assert json.loads(answers[6][1])["$schema"].endswith("2020-12/schema")
    code, out, err = answers[7]
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        "error: workloads/smoke.yaml: engine: the bundled engine needs torch, which is not installed;"
    )
    assert "pip install 'kvplan[engine]'" in err and "--target" in err
    assert imported == []
