"""One measured load test of workloads/smoke.yaml on the tiny random model, shared by the simulator's tests."""

from pathlib import Path

import pytest

from kvplan.run.loadtest import run_loadtest
from kvplan.workload.file import load_workload

ROOT = Path(__file__).resolve().parents[4]
SMOKE = ROOT / "workloads" / "smoke.yaml"


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """The run folder of a measured smoke.yaml load test."""
    return run_loadtest(load_workload(SMOKE), tmp_path_factory.mktemp("smoke-measured") / "run")
