"""Admission in a load test of the tiny random model (tests/kvplan/data/admission.yaml): per-tenant
limits hold exactly in steps.csv, the KV budget leaves no preemption where the same engine without
admission preempts, the shed fraction per level and tenant is the records' own count, and
``kvplan simulate`` refuses exactly the requests the engine refused in a closed-loop level."""

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from kvplan.results.run_result import load_run
from kvplan.run.loadtest import run_loadtest
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import engine_setup
from kvplan.workload.file import load_workload
from tests.kvplan.cli_runner import run_cli

WORKLOAD = Path(__file__).resolve().parents[1] / "data" / "admission.yaml"
CAP, QUEUE = 2, 2  # tenant_max_concurrency, tenant_max_waiting in the workload


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return load_run(run_loadtest(load_workload(WORKLOAD), tmp_path_factory.mktemp("admission") / "run"))


def test_per_tenant_limits_hold_exactly_in_steps_csv(measured):
    rows = list(csv.DictReader((measured.run_dir / "steps.csv").open()))
    admitted = [r for r in rows if r["variant"] == "admission"]
    assert admitted and {"running[alice]", "waiting[alice]", "running[bob]", "waiting[bob]"} <= set(rows[0])
    most = {}
    for tenant in ("alice", "bob"):
        running = [int(r[f"running[{tenant}]"]) for r in admitted]
        waiting = [int(r[f"waiting[{tenant}]"]) for r in admitted]
        assert max(running) <= CAP and max(waiting) <= QUEUE  # never passed
        assert max(r + w for r, w in zip(running, waiting)) <= CAP + QUEUE
        most[tenant] = max(running)
    assert max(most.values()) == CAP  # reached; the waiting limit binds at the entry, before the step:
    refused = [r.finish_detail for r in measured.requests if r.finish_reason == "rejected"]
    assert any(d.startswith("tenant_waiting: ") for d in refused)
    # the columns are the engine's own counts: per step, all tenants' running requests are num_running
    for r in admitted:
        assert int(r["running[alice]"]) + int(r["running[bob]"]) == int(r["num_running"])
        assert int(r["waiting[alice]"]) + int(r["waiting[bob]"]) == int(r["num_waiting"])


def test_the_kv_budget_sheds_instead_of_preempting(measured):
    levels = {lv.key.label: lv for lv in measured.result.levels}
    for load in ("c=8", "400 req/s"):
        on, off = levels[f"{load} admission"], levels[f"{load} no-admission"]
        assert on.num_rejected > 0 and on.num_preemptions == 0
        assert off.num_rejected == 0 and off.num_preemptions > 0 and off.num_completed == 24
        assert on.num_completed + on.num_rejected == on.num_requests == 24
        assert on.num_failed == 0  # a refused request is shed, not failed


def test_the_shed_fraction_per_level_and_tenant_is_the_records_count(measured):
    for lv in measured.result.levels:
        own = [r for r in measured.requests if r.key == lv.key]
        refused = [r for r in own if r.finish_reason == "rejected"]
        assert lv.num_rejected == len(refused) and lv.shed_fraction == len(refused) / len(own)
        assert lv.rejected_reasons == dict(sorted(Counter(r.finish_detail.split(":")[0] for r in refused).items()))
        assert [t.name for t in lv.tenants] == ["alice", "bob"]
        for t in lv.tenants:
            mine = [r for r in own if r.tenant_name == t.name]
            assert t.num_requests == len(mine) and t.num_rejected == sum(r.finish_reason == "rejected" for r in mine)
    rows = list(csv.DictReader((measured.run_dir / "requests.csv").open()))
    refused_rows = [r for r in rows if r["finish_reason"] == "rejected"]
    assert refused_rows and all(r["e2e_ms"] == r["ttft_ms"] == "" for r in refused_rows)  # no latency
    assert all(r["e2e_ms"] != "" for r in rows if r["finish_reason"] in ("stop", "length"))
    summary = (measured.run_dir / "summary.md").read_text()
    assert "## Admission: shed per level" in summary and "## Admission: shed per tenant" in summary
    code, out, err = run_cli("report", str(measured.run_dir), "--json")  # the same counts, machine-readable
    assert code == 0, err
    levels = [lv for b in json.loads(out)["buckets"] for lv in b["levels"]]
    assert [(lv["num_rejected"], lv["shed_fraction"]) for lv in levels] == [
        (lv.num_rejected, lv.shed_fraction) for lv in measured.result.levels
    ]
    assert [[t["num_rejected"] for t in lv["tenants"]] for lv in levels] == [
        [t.num_rejected for t in lv.tenants] for lv in measured.result.levels
    ]


def test_simulate_refuses_exactly_the_requests_the_engine_refused_in_a_closed_loop_level(measured, tmp_path):
    workload = load_workload(WORKLOAD)
    setup, _ = engine_setup(workload, measured.run_dir)  # a step time fitted on the run: closed loop agrees under any
    sim = load_run(simulate(workload, setup, tmp_path / "sim", search=False))
    for variant in ("admission", "no-admission"):
        ran = {r.request_id: r.finish_reason for r in measured.requests if r.key.label == f"c=8 {variant}"}
        simulated = {r.request_id: r.finish_reason for r in sim.requests if r.key.label == f"c=8 {variant}"}
        assert simulated == ran  # request by request: admitted and refused alike
    engine = {lv.key: (lv.num_completed, lv.num_rejected) for lv in measured.result.levels if lv.mode == "closed"}
    simulated = {lv.key: (lv.num_completed, lv.num_rejected) for lv in sim.result.levels if lv.key in engine}
    assert simulated == engine and any(rejected for _, rejected in engine.values())


@pytest.mark.parametrize(
    "admission, problem",
    [
        ({"kv_admission_reserve": -0.1}, "engine.admission.kv_admission_reserve: must be >= 0.0 (got -0.1)"),
        ({"tenant_max_concurrency": 0}, "engine.admission.tenant_max_concurrency: must be >= 1 (got 0)"),
    ],
)
def test_bad_admission_settings_are_one_line_and_exit_2(tmp_path, admission, problem):
    data = yaml.safe_load(WORKLOAD.read_text())
    data["engine"]["admission"] = admission
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    for command in ("loadtest", "simulate"):
        code, out, err = run_cli(command, str(path), "--out", str(tmp_path / command))
        text = (out + err).strip()
        assert code == 2 and len(text.splitlines()) == 1 and problem in text, text
        assert not (tmp_path / command).exists()
