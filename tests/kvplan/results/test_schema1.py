"""Runs written before the typed run result (schema 1) keep working: report, gate and summaries.

The fixture (tests/kvplan/data/schema1, see its README) was recorded with the code of the time:
two run folders, two baselines and what ``kvplan gate`` printed for each.
"""

import json
import shutil
from pathlib import Path

import pytest

from kvplan.results.run_result import load_run
from kvplan.results.summarize import summarize
from tests.kvplan.cli_runner import run_cli

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "schema1"
# What the summary says differently today: one label for an open-loop level everywhere, the fp8
# scales' place in schema 2, and the knee table's simulated knee (empty in these runs),
RENAMED = (
    ("50/s", "50 req/s"),
    ("run.kv_scales", "engine.kv_scales"),
    (
        "at once. Measured knee:",
        "at once. Simulated knee: the lowest concurrency at which the engine's own"
        " scheduler, replayed on the bucket's requests at every concurrency, preempts. Measured knee:",
    ),
    ("| predicted max concurrency | measured knee |", "| predicted max concurrency | simulated knee | measured knee |"),
    # and a knee no level reached is said: none up to the highest closed-loop level (c=4, c=2)
    (
        "|---|---|---|---|---|\n| short | 22 | 5 |  |",
        "|---|---|---|---|---|---|\n| short | 22 | 5 |  | none up to c=4 |",
    ),  # noqa: E501
    (
        "|---|---|---|---|---|\n| short | 19 | 6 |  |",
        "|---|---|---|---|---|---|\n| short | 19 | 6 |  | none up to c=2 |",
    ),
)


@pytest.fixture
def fixture(tmp_path):
    copy = tmp_path / "schema1"
    shutil.copytree(FIXTURE, copy)
    return copy


def test_the_fixture_is_schema_1():
    for run in ("run", "run_fp8"):
        assert json.loads((FIXTURE / run / "results.json").read_text())["schema_version"] == 1


@pytest.mark.parametrize("run", ["run", "run_fp8"])
def test_kvplan_report_re_renders_a_schema_1_folder_with_the_same_content(fixture, run):
    run_dir = fixture / run
    before = (run_dir / "summary.md").read_text()
    results_before = (run_dir / "results.json").read_bytes()
    (run_dir / "summary.md").unlink()
    code, out, err = run_cli("report", str(run_dir))
    assert (code, err) == (0, "") and out.rstrip().endswith(f"report: {run_dir}")
    expected = before
    for old, new in RENAMED:
        expected = expected.replace(old, new)
    assert (run_dir / "summary.md").read_text() == expected
    assert (run_dir / "results.json").read_bytes() == results_before  # an old run's file is left alone
    for name in ("kv_over_time.png", "latency_short.png", "throughput_goodput.png", "requests.csv", "steps.csv"):
        assert (run_dir / name).stat().st_size > 0


@pytest.mark.parametrize("baseline, code", [("baseline_self.yaml", 0), ("baseline_big.yaml", 1)])
def test_kvplan_gate_gives_the_same_verdict_on_schema_1(fixture, baseline, code, monkeypatch):
    monkeypatch.chdir(fixture)  # paths as they were given when the verdicts were recorded
    got = run_cli("gate", "run", "--baseline", baseline)
    recorded = (FIXTURE / baseline.replace("baseline", "verdict").replace(".yaml", ".txt")).read_text()
    assert got[0] == code and got[2] == ""
    # the first line names the baseline file, renamed since (base_self.yaml -> baseline_self.yaml)
    assert got[1].splitlines()[0] == recorded.splitlines()[0].replace("base_", "baseline_")
    assert got[1].splitlines()[1:] == recorded.splitlines()[1:]
    assert got[1].splitlines()[-1] == ("gate: 64 passed, 0 failed" if code == 0 else "gate: 62 passed, 2 failed")


@pytest.mark.parametrize("run", ["run", "run_fp8"])
def test_migrated_summaries_equal_todays_summaries_of_the_same_records(run):
    data = load_run(FIXTURE / run)
    assert data.result.schema_version == 2 and data.result.source == "measured"
    again = summarize(data.result, data.requests, data.steps)
    # added since: an open-loop level's arrival CVs; a run recorded before arrival processes reads as Poisson
    arrivals = ("arrival_process", "requested_cv", "achieved_cv")
    assert [(lv.arrival_process, lv.requested_cv) for lv in again.levels if lv.mode == "open"] == [
        ("poisson", 1.0) for lv in data.result.levels if lv.mode == "open"
    ]
    # and the shed fraction (admission): a run recorded before it reads as unknown, today's as 0 shed
    assert [lv.shed_fraction for lv in again.levels] == [0.0] * len(data.result.levels)
    assert {lv.shed_fraction for lv in data.result.levels} == {None}
    added = (*arrivals, "shed_fraction")
    assert [lv.model_copy(update=dict.fromkeys(added)) for lv in again.levels] == data.result.levels
    assert again.buckets == data.result.buckets
    assert again.kv == data.result.kv
    assert again.prefix_caching == data.result.prefix_caching


def test_the_migration_moves_engine_facts_and_the_kv_dtype_name():
    raw = json.loads((FIXTURE / "run_fp8" / "results.json").read_text())
    result = load_run(FIXTURE / "run_fp8").result
    assert result.engine.num_blocks == raw["run"]["num_blocks"] == 32
    assert result.engine.bytes_per_token == raw["run"]["bytes_per_token"]
    assert result.engine.kv_scales.k_scales == raw["run"]["kv_scales"]["k_scales"]
    assert result.run.torch == raw["run"]["torch"] and result.run.dataset == raw["run"]["dataset"]
    assert result.estimate.kv_cache_dtype == raw["estimate"]["kv_dtype"] == "fp8"
    assert result.slo.model_dump() == raw["workload"]["config"]["slo"]
    plan = load_run(FIXTURE / "run").result.estimate.plan[0]
    assert plan.kv_cache_dtype == "fp8" and plan.gpu == "L4"
