"""Step times kept on disk (kvplan.sizing.gpus.silicon_memo): a later process answers the shapes
asked before without building aiconfigurator's engine or repeating its warm-up, builds it only
for a shape the file lacks, and every step time equals the one computed afresh, float for float."""

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.sizing.gpus import silicon_memo
from kvplan.sizing.gpus.silicon_memo import LazyHandle, StepMemo

ROOT = Path(__file__).resolve().parents[3]
# step times of a dense and a MoE target in a fresh process; "kept": the engine may not be built
# nor warmed up there
SCRIPT = """
import json, sys
from kvplan.run.sim.cost import StepWork
from kvplan.sizing.gpus import silicon
from kvplan.sizing.models.model_source import load_model_config
mode, shapes = sys.argv[1], sys.argv[2]
def refuse(*args, **kwargs):
    raise AssertionError("built or warmed up the engine")
if mode == "kept":
    silicon.warm_up = silicon.engine_handle = refuse
works = [StepWork(0, 8, 0, 8 * 1153, 8 * 1153, 8 * 1153), StepWork(1024, 0, 1, 1024, 1024 * 1025 // 2),
         StepWork(700, 63, 2, 700 + 63 * 4000, 700 * 701 // 2 + 63 * 4000, 63 * 4000)]
if shapes == "more":  # a decode shape the first works do not ask
    works.append(StepWork(0, 300, 0, 300 * 20000, 300 * 20000, 300 * 20000))
out = {}
for model, system, tp in (("llama-3.1-70b", "h100_sxm", 4), ("deepseek-v3", "b200_sxm", 8)):
    cost = silicon.silicon_cost(load_model_config(model)[0], system, tp)
    assert isinstance(cost, silicon.SiliconStepCost), cost
    out[model] = [cost.step_seconds(w).hex() for w in works]
    out[model + " decode run"] = [x.hex() for x in cost.decode_seconds(16, [16 * 900, 16 * 901, 16 * 5000]).tolist()]
print(json.dumps(out))
"""


def step_times(cache: Path, mode: str, shapes: str = "first") -> dict:
    env = {
        **os.environ,
        "KVPLAN_CACHE": str(cache),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, shapes], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_later_process_answers_from_the_kept_step_times(tmp_path):
    pytest.importorskip("aiconfigurator_core")
    fresh = step_times(tmp_path / "fresh", "fresh", "more")  # no file: every answer from the engine
    first = step_times(tmp_path / "kept", "fresh")  # writes the memo at its exit
    memos = sorted((tmp_path / "kept" / "aiconfigurator").glob("steps-*.bin"))
    assert len(memos) == 2  # one per target, beside the kept engines
    assert step_times(tmp_path / "kept", "kept") == first  # no engine built, the same floats
    grown = step_times(tmp_path / "kept", "lazy", "more")  # a new shape: the engine built then
    assert grown == fresh and {k: v[:3] for k, v in grown.items() if "run" not in k} == {
        k: v for k, v in first.items() if "run" not in k
    }
    assert step_times(tmp_path / "kept", "kept", "more") == fresh  # the new shape kept too
    for path in memos:  # a damaged file is not read: the engine is built and warmed up again
        path.write_bytes(path.read_bytes()[:50])
    assert step_times(tmp_path / "kept", "fresh", "more") == fresh


def test_memo_keeps_merges_and_refuses_what_it_did_not_write(tmp_path):
    path = tmp_path / "steps-x.bin"
    memo = StepMemo(path)
    assert not memo.kept and len(memo) == 0
    memo[("decode", 8, 1153)] = 0.1 + 0.2
    memo.keep()
    assert memo.kept and StepMemo(path) == {("decode", 8, 1153): 0.1 + 0.2}
    other = StepMemo(path)  # another process adds its own while this one adds another
    other[("shared", 1024, 1)] = 3.5
    memo[("decode", 16, 900)] = 1e-300
    other.keep()
    memo.keep()
    assert StepMemo(path) == {("decode", 8, 1153): 0.1 + 0.2, ("shared", 1024, 1): 3.5, ("decode", 16, 900): 1e-300}
    path.write_bytes(b"kvplan-step-memo-1 marshal 1 python 2.7\n" + marshal.dumps({("decode", 1, 1): 1.0}))
    assert StepMemo(path) == {} and not StepMemo(path).kept  # another marshal or Python: not read
    path.write_bytes(silicon_memo._HEADER + b"\x00garbage")
    assert StepMemo(path) == {}
    assert StepMemo(None) == {} and StepMemo(None).keep() is None  # never read nor written


def test_lazy_handle_builds_once_when_first_used():
    built = []

    class Engine:
        def evaluate(self, x):
            return 2 * x

    def build():
        built.append(1)
        return Engine()

    warmed = []
    handle = LazyHandle(build, warmed.append)
    assert built == [] and warmed == []
    assert handle.evaluate(3) == 6 and handle.evaluate(4) == 8 and built == [1]
    assert len(warmed) == 1 and isinstance(warmed[0], Engine)  # warmed up once, the engine itself
