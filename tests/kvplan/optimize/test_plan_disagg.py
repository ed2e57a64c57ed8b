"""``kvplan plan --disagg``: xPyD units judged beside aggregated replicas. A unit's numbers equal
``kvplan simulate`` of the same disaggregated plan entry run apart; replicas, GPUs and cost by hand
arithmetic; a workload where disaggregation pays (7,800-token documents mixed into chats under a
tight TPOT SLO: every document's prefill stretches the chats' decode steps) and one where it does
not (a loose TPOT: one pool serves both); bad settings one line, exit 2."""

import json
import math
from pathlib import Path

import pytest

from kvplan.sizing.gpus.prices import load_prices
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.scratch import scratch

WORKLOAD = """name: docs-and-chats
seed: 0
engine: {{model: SmolLM2-135M-Instruct, block_size: 16, max_num_seqs: 256, max_num_batched_tokens: 8192,
         enable_prefix_caching: false}}
dataset: random
slo: {slo}
buckets:
  - name: support
    mix:
      - {{name: chat, weight: 0.8, input_tokens: 200, output_tokens: 200}}
      - {{name: doc, weight: 0.2, input_tokens: 7800, output_tokens: 200}}
    concurrency: [4]
    num_requests: 60
plan: [{plan}]
"""
TIGHT_TPOT = "{ttft_ms: 1000, tpot_ms: 15}"
LOOSE_TPOT = "{ttft_ms: 500, tpot_ms: 50}"
UNIT = "{model: llama-3.1-8b, gpu: H100-SXM, tp: 1, disagg: {prefill: {workers: 1}, decode: {workers: 1}}}"
ARGS = ("--model", "llama-3.1-8b", "--gpus", "H100-SXM", "--tp", "1", "--disagg")
ARGS += ("--prefill-workers", "1", "--decode-workers", "1", "--jobs", "2")


def workload(slo: str) -> Path:
    path = scratch("kvplan-disagg-") / "w.yaml"
    path.write_text(WORKLOAD.format(slo=slo, plan=UNIT))
    return path


def plan_json(path: Path, *args: str) -> dict:
    code, out, err = run_cli("plan", str(path), *args, "--json", "--out", str(path.parent / "plan"))
    assert code == 0, err
    return json.loads(out)


def by_shape(planned: dict) -> dict:
    return {c["disagg"]: c for c in planned["configs"]}


@pytest.fixture(scope="module")
def tight() -> dict:
    return plan_json(workload(TIGHT_TPOT), *ARGS, "--rate", "44")


def test_a_unit_equals_kvplan_simulate_of_the_same_disaggregated_target():
    path = workload(TIGHT_TPOT)
    unit = by_shape(plan_json(path, *ARGS, "--users", "16"))["1P tp1 + 1D tp1 over rdma-400g"]
    code, out, err = run_cli("simulate", str(path), "--json", "--out", str(path.parent / "sim"))
    assert code == 0, err
    (target,) = [t for t in json.loads(out)["targets"] if t["target"] == "plan[0]"]
    assert target["disagg"] == unit["disagg"]
    (bucket,) = target["buckets"]
    assert unit["slo_max_concurrency"] == bucket["max_concurrency"]["level"]
    assert unit["slo_max_request_rate"] == bucket["max_request_rate"]["level"]
    assert unit["replicas"] == math.ceil(16 / unit["slo_max_concurrency"])


def test_cost_is_gpus_of_both_pools_times_the_price(tight):
    price = load_prices()["H100-SXM"].usd_per_gpu_hour
    unit, agg = by_shape(tight)["1P tp1 + 1D tp1 over rdma-400g"], by_shape(tight)[None]
    assert (unit["prefill_workers"], unit["prefill_tp"], unit["decode_workers"], unit["tp"]) == (1, 1, 1, 1)
    assert (unit["link"], unit["prefill_max_num_seqs"], unit["prefill_max_num_batched_tokens"]) == (
        "rdma-400g",
        256,
        8192,
    )
    assert agg["prefill_workers"] is None and agg["link"] is None
    for c, per_replica in ((unit, 1 * 1 + 1 * 1), (agg, 1)):
        assert c["num_gpus_per_replica"] == per_replica
        assert c["replicas"] == math.ceil(44 / c["slo_max_request_rate"] - 1e-9)
        assert c["num_gpus"] == c["replicas"] * per_replica
        assert c["usd_per_hour"] == pytest.approx(c["num_gpus"] * price)
        # every request asks for 200 output tokens: $/1M = $/h / (44 req/s x 200 x 3,600 / 1e6)
        assert c["usd_per_m_output_tokens"] == pytest.approx(c["usd_per_hour"] / (44 * 200 * 3600 / 1e6))


def test_disaggregation_pays_when_documents_stretch_the_chats_decode_steps(tight):
    unit, agg = by_shape(tight)["1P tp1 + 1D tp1 over rdma-400g"], by_shape(tight)[None]
    assert unit["meets_slo"] and agg["meets_slo"] and tight["best"] == unit
    assert unit["usd_per_hour"] < agg["usd_per_hour"] and unit["num_gpus"] < agg["num_gpus"]
    # the aggregated replica is bound by TPOT (a document's prefill shares the chats' steps): its
    # capacity per GPU is below the unit's
    assert agg["slo_max_request_rate"] < unit["slo_max_request_rate"] / 2
    fewer = agg["num_gpus"] - unit["num_gpus"]
    assert tight["disagg_verdict"].startswith("disaggregation pays: H100-SXM 1P tp1 + 1D tp1 over rdma-400g x")
    assert tight["disagg_verdict"].endswith(f": {fewer} GPU(s) fewer")


def test_disaggregation_does_not_pay_when_one_pool_meets_a_loose_slo(tmp_path):
    path = workload(LOOSE_TPOT)
    loose = plan_json(path, *ARGS, "--rate", "20")
    unit, agg = by_shape(loose)["1P tp1 + 1D tp1 over rdma-400g"], by_shape(loose)[None]
    assert loose["best"] == agg and agg["usd_per_hour"] < unit["usd_per_hour"]
    more = unit["num_gpus"] - agg["num_gpus"]
    assert loose["disagg_verdict"].startswith("disaggregation does not pay: H100-SXM 1P tp1 + 1D tp1")
    assert loose["disagg_verdict"].endswith(f": {more} GPU(s) more")
    # the run folder's summary and kvplan report say it too
    assert f"## Disaggregation\n\n{loose['disagg_verdict']}\n" in (path.parent / "plan" / "summary.md").read_text()
    code, out, err = run_cli("report", str(path.parent / "plan"))
    assert code == 0 and loose["disagg_verdict"] in out.replace("\n", ""), err


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--prefill-workers", "0"), "--prefill-workers: must be integers >= 1 (got '0')"),
        (("--decode-workers", "2,0"), "--decode-workers: must be integers >= 1 (got '2,0')"),
        (("--prefill-tp", "3"), "--prefill-tp: 3 does not divide the 32 attention heads"),
        (("--decode-tp", "1,3"), "--decode-tp: 3 does not divide the 32 attention heads"),
        (("--links", "pcie9"), "--links: unknown link 'pcie9'"),
        (("--window", "60"), "--disagg: is not judged window by window yet"),
    ],
)
def test_bad_disagg_settings_are_one_line_and_exit_2(tmp_path, args, line):
    path = workload(TIGHT_TPOT)
    code, out, err = run_cli("plan", str(path), "--model", "llama-3.1-8b", "--rate", "1", "--disagg", *args)
    if args[0] == "--window":
        code, out, err = run_cli("plan", str(path), "--model", "llama-3.1-8b", "--disagg", *args)
    assert code == 2 and line in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "args",
    [
        ("--prefill-workers", "2"),
        ("--decode-workers", "1,2,4"),  # typed, even at the default
        ("--links", "nvlink4"),
        ("--prefill-tp", "1"),
        ("--decode-tp", "2"),
        ("--prefill-max-num-seqs", "8"),
        ("--prefill-max-num-batched-tokens", "4096"),
    ],
)
def test_a_disagg_setting_without_disagg_is_refused_not_ignored(tmp_path, args):
    # once: exit 0, a plan of aggregated replicas only, the setting read by nothing
    path = workload(TIGHT_TPOT)
    run = tmp_path / "plan"
    code, out, err = run_cli("plan", str(path), "--model", "llama-3.1-8b", "--rate", "1", *args, "--out", str(run))
    assert code == 2 and out == "" and not run.exists(), err
    assert (
        err.strip() == f"error: {args[0]}: applies with --disagg only, which is not given; add --disagg or leave it out"
    )
