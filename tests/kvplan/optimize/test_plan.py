"""``kvplan plan``: the cheapest configuration meeting the SLO, checked by simulating it again
independently at the load (and with one replica fewer, which must miss), the ranking and the
arithmetic of replicas and cost recomputed by hand, and bad input one line."""

import json
import math
from pathlib import Path

import pytest

from kvplan.run.sim.gpu_target import gpu_setup
from kvplan.run.sim.run import sample
from kvplan.run.sim.search import Prober
from kvplan.sizing.gpus.prices import load_prices
from kvplan.workload.file import load_workload
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.scratch import scratch

ROOT = Path(__file__).resolve().parents[3]
CHAT = ROOT / "workloads" / "chat.yaml"
RATE = 20.0


def plan_json(*args: str) -> dict:
    run_dir = scratch("kvplan-plan-") / "run"
    code, out, err = run_cli("plan", str(CHAT), *args, "--json", "--jobs", "2", "--out", str(run_dir))
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def planned():
    """The acceptance question: 20 req/s of chat.yaml's short bucket for Llama-3.1-8B on four GPU kinds."""
    return plan_json("--model", "llama-3.1-8b", "--rate", str(RATE), "--gpus", "H100-SXM,A100-80GB,L40S,L4")


@pytest.fixture(scope="module")
def replicated():
    """A load one replica cannot carry: 150 req/s on L4s."""
    return plan_json("--model", "llama-3.1-8b", "--rate", "150", "--gpus", "L4", "--tp", "1,2")


def prober_for(config: dict) -> Prober:
    """chat.yaml's short bucket on the configuration, simulated apart from the search."""
    workload = load_workload(CHAT)
    engine = workload.engine.model_copy(
        update={"max_num_seqs": config["max_num_seqs"], "max_num_batched_tokens": config["max_num_batched_tokens"]}
    )
    workload = workload.model_copy(update={"engine": engine, "buckets": workload.buckets[:1], "plan": []})
    setup = gpu_setup(workload, "llama-3.1-8b", config["gpu"], config["tp"], config["kv_cache_dtype"])
    return Prober(workload, setup.facts, setup.clock, sample(workload, setup.facts).requests)


def attainment_at(config: dict, rate_per_replica: float) -> float:
    """The SLO attainment of a steady open-loop level at ``rate_per_replica`` on the configuration."""
    prober = prober_for(config)
    level = prober.level(0, "open", rate_per_replica, plan=prober.steady(8, 0, rate_per_replica))
    assert level is not None
    return level.slo_attainment


def saturation(config: dict) -> float:
    """Requests/s a replica serves with max_num_seqs users in flight: above it the queue only grows."""
    prober = prober_for(config)
    users = config["max_num_seqs"]
    level = prober.level(0, "closed", users, plan=prober.steady(users, 0))
    assert level is not None
    return level.requests_per_s


def test_the_best_meets_the_slo_at_the_load_and_one_replica_fewer_would_not(planned, replicated):
    best = planned["best"]
    assert best == planned["configs"][0] and best["meets_slo"] and planned["load"] == {"rate": RATE}
    assert attainment_at(best, RATE / best["replicas"]) >= 0.95
    best = replicated["best"]
    assert best["meets_slo"] and best["replicas"] > 1
    assert attainment_at(best, 150 / best["replicas"]) >= 0.95
    # one replica fewer: each would get more than a replica can serve, so its queue grows without bound
    assert 150 / best["replicas"] <= saturation(best) * 1.02 < 150 / (best["replicas"] - 1)


@pytest.mark.parametrize("which", ["planned", "replicated"])
def test_replicas_gpus_and_cost_are_the_arithmetic_of_the_capacity_and_the_price(which, request):
    planned = request.getfixturevalue(which)
    rate = planned["load"]["rate"]
    prices = load_prices()
    for c in planned["configs"]:
        if not c["meets_slo"]:
            continue
        assert c["replicas"] == math.ceil(rate / c["slo_max_request_rate"] - 1e-9)
        assert c["num_gpus"] == c["replicas"] * c["tp"] == c["replicas"] * c["num_gpus_per_replica"]
        if c["gpu"] in prices:
            assert c["usd_per_hour"] == pytest.approx(c["num_gpus"] * prices[c["gpu"]].usd_per_gpu_hour)
            assert c["cost_source"] == prices[c["gpu"]].source
    met = [c for c in planned["configs"] if c["meets_slo"]]
    priced = [c["usd_per_hour"] for c in met if c["usd_per_hour"] is not None]
    assert priced == sorted(priced)  # cheapest first
    assert all(not c["feasible"] or not c["meets_slo"] for c in planned["configs"][len(met) :])


def test_infeasible_configurations_say_why():
    found = plan_json("--model", "llama-3.1-70b", "--rate", "1", "--gpus", "L4", "--tp", "1,8")
    by_tp = {c["tp"]: c for c in found["configs"]}
    assert not by_tp[1]["feasible"] and "weights" in by_tp[1]["reason"] and by_tp[1]["replicas"] is None
    assert by_tp[8]["feasible"] and found["configs"][0]["tp"] == 8


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--rate", "0"], "rate: must be a finite number > 0"),
        (["--rate", "5", "--gpus", "H100-SXMX"], "gpu"),
        (["--users", "4", "--rate", "2"], "rate: give the load as --rate or as --users"),
        (["--rate", "5", "--tp", "two"], "tp: must be comma-separated integers"),
        (["--rate", "5", "--model", "llama-3.1-405b", "--gpus", "L4", "--tp", "1"], "no configuration fits"),
        (["--rate", "inf"], "rate: must be a finite number > 0"),
        (["--rate", "5", "--gpus", ","], "gpus: names no GPU"),
        (["--rate", "5", "--tp", "2", "--max-gpus", "1"], "tp: no --tp value is within --max-gpus 1"),
        (["--rate", "5", "--kv-cache-dtype", "fp9"], "kv-cache-dtype: unknown dtype 'fp9'"),
    ],
)
def test_bad_input_is_one_line(args, line, tmp_path):
    base = ["plan", str(CHAT)] + ([] if "--model" in args else ["--model", "llama-3.1-8b"])
    code, out, err = run_cli(*base, *args, "--jobs", "1", "--out", str(tmp_path / "run"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and line in err, err


def test_the_pareto_frontier_keeps_what_nothing_beats_on_both_axes(planned, tmp_path):
    from kvplan.results.plan_result import ConfigResult
    from kvplan.results.report.plan_view import pareto

    results = [ConfigResult(**c) for c in planned["configs"]]
    front = pareto(results)
    points = [(r.output_tokens_per_s_per_user, r.output_tokens_per_s_per_gpu) for r in results if r.meets_slo]
    for r in front:  # nothing beats a frontier point on both
        mine = (r.output_tokens_per_s_per_user, r.output_tokens_per_s_per_gpu)
        assert not any(u >= mine[0] and g >= mine[1] and (u, g) != mine for u, g in points)
    for u, g in points:  # and every other point is beaten by one of them
        if (u, g) not in [(r.output_tokens_per_s_per_user, r.output_tokens_per_s_per_gpu) for r in front]:
            assert any(r.output_tokens_per_s_per_user >= u and r.output_tokens_per_s_per_gpu >= g for r in front)
    best = results[0]
    assert best.output_tokens_per_s_per_gpu == pytest.approx(
        best.output_tokens_per_s_per_user * best.slo_max_concurrency / best.tp
    )
    chart = tmp_path / "pareto.png"
    code, _, err = run_cli(
        "plan",
        str(CHAT),
        "--model",
        "llama-3.1-8b",
        "--rate",
        "20",
        "--gpus",
        "L4",
        "--tp",
        "1",
        "--pareto",
        str(chart),
        "--out",
        str(tmp_path / "run"),
    )
    assert code == 0, err
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _variant(tmp_path: Path, name: str, **changes) -> Path:
    """chat.yaml with top-level keys replaced (``None``: removed)."""
    import yaml

    data = yaml.safe_load(CHAT.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_tpot_only_slo_sizes_replicas_by_the_saturation_rate(tmp_path):
    """A TPOT-only SLO holds at any rate (a queue never breaks it): a replica serves what
    max_num_seqs in flight serve, the closed loop at max_num_seqs users, simulated apart."""
    workload = _variant(tmp_path, "tpot", slo={"tpot_ms": 200})
    code, out, err = run_cli(
        "plan",
        str(workload),
        "--model",
        "llama-3.1-8b",
        "--gpus",
        "L4",
        "--tp",
        "1",
        "--rate",
        "100",
        "--json",
        "--out",
        str(tmp_path / "run"),
    )
    assert code == 0, err
    best = json.loads(out)["best"]
    assert best["meets_slo"] and best["slo_max_concurrency"] == best["max_num_seqs"]
    served = saturation(best)
    assert best["slo_max_request_rate"] == pytest.approx(served, rel=1e-3)
    assert best["replicas"] == math.ceil(100 / best["slo_max_request_rate"] - 1e-9) > 1


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({"slo": None}, "slo: the workload sets no SLO"),
        ({"dataset": {"kind": "random", "sessions": {"max_turns": 3}}}, "dataset.sessions: kvplan plan sizes"),
    ],
)
def test_a_workload_plan_cannot_size_is_one_line(tmp_path, changes, line):
    workload = _variant(tmp_path, "bad", **changes)
    code, _, err = run_cli(
        "plan", str(workload), "--model", "llama-3.1-8b", "--rate", "5", "--out", str(tmp_path / "r")
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and line in err, err
