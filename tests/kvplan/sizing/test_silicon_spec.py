"""aiconfigurator-core's compiled engine kept on disk (kvplan.sizing.gpus.silicon_spec): a later
process builds the engine from the kept spec without reading the database, and every step time
equals the one of the engine compiled from the database (a dense model on H100 at tp 4, a MoE
model on B200 at tp 8; prefill, decode and mixed steps, float for float)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

aic = pytest.importorskip("aiconfigurator_core")

ROOT = Path(__file__).resolve().parents[3]
# each target's step times in a fresh process; with "refuse", the database may not be read there
SCRIPT = """
import json, sys
from aiconfigurator_core.sdk import perf_database
from kvplan.run.sim.cost import StepWork
from kvplan.sizing.gpus import silicon
from kvplan.sizing.models.model_source import load_model_config
if sys.argv[1] == "refuse":
    def refuse(*args, **kwargs):
        raise AssertionError("read the database")
    perf_database.get_database = refuse
works = [StepWork(0, 8, 0, 8 * 1153, 8 * 1153, 8 * 1153), StepWork(1024, 0, 1, 1024, 1024 * 1025 // 2),
         StepWork(700, 63, 2, 700 + 63 * 4000, 700 * 701 // 2 + 63 * 4000, 63 * 4000),
         StepWork(0, 300, 0, 300 * 20000, 300 * 20000, 300 * 20000)]
out = {}
for model, system, tp in (("llama-3.1-70b", "h100_sxm", 4), ("deepseek-v3", "b200_sxm", 8)):
    cost = silicon.silicon_cost(load_model_config(model)[0], system, tp)
    assert isinstance(cost, silicon.SiliconStepCost), cost
    out[model] = [cost.step_seconds(w).hex() for w in works]
print(json.dumps(out))
"""


def step_times(cache: Path, mode: str) -> dict:
    env = {
        **os.environ,
        "KVPLAN_CACHE": str(cache),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_later_process_builds_the_kept_engine_with_equal_step_times(tmp_path):
    compiled = step_times(tmp_path, "compile")
    kept = sorted(p.name for p in (tmp_path / "aiconfigurator").glob("engine-*.bin"))
    assert len(kept) == 2  # one per target
    assert step_times(tmp_path, "refuse") == compiled  # the database not read, the same floats
    for path in (tmp_path / "aiconfigurator").glob("engine-*.bin"):  # a damaged file is built again
        path.write_bytes(path.read_bytes()[:100])
    assert step_times(tmp_path, "compile") == compiled
