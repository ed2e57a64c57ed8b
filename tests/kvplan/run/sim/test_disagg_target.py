"""A plan entry with ``disagg:``: its settings checked in one line each (exit 2), and simulated on
two pools of the engine's schedulers with the KV transfer priced over the named link."""

import json

import pytest

from kvplan.run.driver import Submission
from kvplan.run.sim.cost import StepWork
from kvplan.run.sim.gpu_target import disagg_setup
from kvplan.workload.file import parse_workload
from tests.kvplan.cli_runner import run_cli

ENTRY = "{model: llama-3.1-8b, gpu: H100-SXM, tp: 1}"
DISAGG = "{model: llama-3.1-8b, gpu: H100-SXM, tp: 1, disagg: {prefill: {workers: 1}, decode: {workers: 2, max_num_seqs: 32}, link: rdma-400g}}"  # noqa: E501
WORKLOAD = f"""name: dis
engine: {{model: SmolLM2-135M-Instruct, block_size: 16, num_blocks: 2048, max_num_seqs: 64,
         max_num_batched_tokens: 4096, enable_prefix_caching: false}}
dataset: random
slo: {{ttft_ms: 2000, tpot_ms: 50}}
buckets: [{{name: long, input_tokens: 2000, output_tokens: 64, concurrency: [1], num_requests: 4}}]
plan: [{ENTRY}, {DISAGG}]
"""


@pytest.mark.parametrize(
    ("setting", "line"),
    [
        ("prefill: {workers: 0}", "plan[1].disagg.prefill.workers: must be >= 1 (got 0)"),
        ("decode: {tp: 3}", "plan[1].disagg.decode.tp: 3 does not divide the 32 attention heads"),
        (
            "link: pcie9",
            "plan[1].disagg.link: unknown link 'pcie9' (closest: pcie5, pcie4, pcie5-x8); use one of nvlink3,",
        ),
        # the value as written: the link is read before pydantic's types (a bad gbps named plainly)
        ("link: {gbps: 0}", "plan[1].disagg.link: needs a gbps above 0 (got 0)"),
        ("prefill: {max_num_seqs: 0}", "plan[1].disagg.prefill.max_num_seqs: must be >= 1"),
        # a pool's own ep is checked as the entry's would be (Llama-3.1-8B is dense)
        ("decode: {tp: 2, ep: 2}", "plan[1].disagg.decode.ep:"),
    ],
)
def test_bad_disagg_settings_are_one_line_and_exit_2(tmp_path, setting, line):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD.replace(DISAGG, f"{{model: llama-3.1-8b, gpu: H100-SXM, disagg: {{{setting}}}}}"))
    code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / "run"))
    assert code == 2 and line in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_one_request_through_the_pools_on_the_target_clock():
    workload = parse_workload(__import__("yaml").safe_load(WORKLOAD))
    setup = disagg_setup(workload, workload.plan[1], "plan[1]")
    assert setup.disagg == "1P tp1 + 2D tp1 over rdma-400g" and setup.facts.max_num_seqs == 2 * 32
    backend = setup.make_backend()
    backend.submit(Submission("L/0", tuple(range(2000)), 3, 0, "s", arrival_time=0.0))
    done = []
    while not done:
        done, _ = backend.advance(None)
    (r,) = done
    (step,) = backend.prefill[0].steps  # the whole prompt in one step of the 4,096-token budget
    assert step.num_prefill_tokens == 2000 and r.token_times[0] == step.end_time > 0
    # Llama-3.1-8B bf16 KV: 32 layers x 2 x 8 heads x 128 x 2 bytes = 131,072 bytes a token; 2,000
    # tokens in 125 blocks of 16; rdma-400g: 50 GB/s, 5 us setup
    assert r.kv_transfer_s == pytest.approx(5e-6 + 125 * 16 * 131072 / 50e9)
    decode = backend.decode[0]
    first = decode.steps[0]  # the decode worker's first step starts when the transfer ends
    assert first.start_time == pytest.approx(r.token_times[0] + r.kv_transfer_s)
    assert r.token_times[1] == first.end_time
    assert first.end_time - first.start_time == pytest.approx(
        decode.clock.step_end(0.0, StepWork(0, 1, 0, 2001, 2001, 2001))
    )


def test_simulate_answers_for_a_disaggregated_plan_entry(tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / "run"), "--json")
    assert code == 0, err
    targets = {t["target"]: t for t in json.loads(out)["targets"]}
    assert targets["plan[0]"]["disagg"] is None
    assert targets["plan[1]"]["disagg"] == "1P tp1 + 2D tp1 over rdma-400g"
    if targets["plan[0]"]["step_times"].startswith("silicon"):  # aiconfigurator-core installed
        # the pools take the operation times alone, the aggregated entry the backend's fit: said apart
        assert targets["plan[1]"]["step_times"] == targets["plan[0]"]["step_times"] + ", unfitted"
    agg, dis = targets["plan[0]"]["buckets"][0], targets["plan[1]"]["buckets"][0]
    # three GPUs carry more than one: each probe ran the pools (the capacity search is unchanged)
    assert dis["max_request_rate"]["level"] > agg["max_request_rate"]["level"]


def test_first_token_from_decode_as_vllms_proxy_streams_it():
    """first_token: decode: the prefill worker's token is dropped, the decode worker makes every
    token the client sees (one step more), the first after the transfer and one decode step."""
    data = __import__("yaml").safe_load(WORKLOAD)
    data["plan"][1]["disagg"]["first_token"] = "decode"
    workload = parse_workload(data)
    setup = disagg_setup(workload, workload.plan[1], "plan[1]")
    assert setup.disagg == "1P tp1 + 2D tp1 over rdma-400g, first token from decode"
    backend = setup.make_backend()
    backend.submit(Submission("L/0", tuple(range(2000)), 3, 0, "s", arrival_time=0.0))
    backend.submit(Submission("L/1", tuple(range(100)), 1, 0, "s", arrival_time=0.0))
    done = {}
    while len(done) < 2:
        done |= {r.request_id: r for r in backend.advance(None)[0]}
    r, one = done["L/0"], done["L/1"]
    (step,) = backend.prefill[0].steps  # both prompts in one prefill step
    assert step.num_prefill_tokens == 2100
    decode = backend.decode[0]  # L/0's worker (request i -> decode worker i mod 2)
    assert len(decode.steps) == 3 and r.num_output_tokens == 3 == len(r.token_times)
    # token 1 reaches the client at the end of the decode worker's first step, after the transfer
    assert decode.steps[0].start_time == pytest.approx(step.end_time + r.kv_transfer_s)
    assert r.token_times == tuple(s.end_time for s in decode.steps)
    assert r.token_times[0] > step.end_time
    # a max_tokens-1 request is handed off too: its one token from its decode worker's one step
    (only,) = backend.decode[1].steps
    assert one.num_output_tokens == 1 and one.token_times == (only.end_time,) and one.kv_transfer_s > 0


def test_pools_take_the_operation_times_without_the_aggregated_fit():
    """A disaggregated pool on measured silicon is timed by aiconfigurator-core's operation times
    alone (scales 1, no overheads); the aggregated entry on the same GPU keeps the backend's fit.
    Hand arithmetic from data/silicon_fit.yaml's vLLM line: aggregated decode step = decode_scale x
    ops / 1000 + step overhead + layer overhead x 32 layers + sequence overhead x n, so the pool's
    step is that with the overheads taken off and the scale divided out."""
    pytest.importorskip("aiconfigurator_core")
    from kvplan.run.sim.gpu_target import gpu_setup
    from kvplan.sizing.gpus.silicon import SiliconFit, SiliconStepCost, silicon_fit

    workload = parse_workload(__import__("yaml").safe_load(WORKLOAD))
    pools = disagg_setup(workload, workload.plan[1], "plan[1]").make_backend()
    aggregated = gpu_setup(workload, "llama-3.1-8b", "H100-SXM", 1).clock().cost
    fit = silicon_fit("vllm")
    assert isinstance(aggregated, SiliconStepCost) and aggregated.fit == fit and fit.decode_scale != 1
    for worker in (pools.prefill[0], pools.decode[0], pools.decode[1]):
        assert isinstance(worker.clock.cost, SiliconStepCost) and worker.clock.cost.fit == SiliconFit()
    n, context = 8, 8 * 1500
    work = StepWork(0, n, 0, context, context, context)
    pool_s = pools.decode[0].clock.cost.step_seconds(work)
    overheads = fit.step_overhead_s + fit.layer_overhead_s * 32 + fit.seq_overhead_s * n
    assert pool_s == pytest.approx((aggregated.step_seconds(work) - overheads) / fit.decode_scale, rel=1e-9)


def test_pools_that_fall_back_to_the_roofline_say_so_once(tmp_path):
    """Both pools on an L4 (no aiconfigurator-core data, or none installed): the roofline note is
    one line for the entry, not one per pool."""
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD.replace(DISAGG, DISAGG.replace("H100-SXM", "L4")))
    code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / "run"), "--json")
    assert code == 0, err
    lines = [line for line in err.splitlines() if "plan[1]" in line and "timed by the roofline" in line]
    assert len(lines) == 1, err


def test_a_gpu_target_of_a_disaggregated_engine_says_it_runs_one_aggregated_replica(tmp_path):
    """``--model/--gpu`` on a workload whose engine is disaggregated (workloads/disagg.yaml) simulates
    one aggregated replica of the model on the GPU: a line says so, instead of silence."""
    from pathlib import Path

    disagg = Path(__file__).resolve().parents[4] / "workloads" / "disagg.yaml"
    code, out, err = run_cli(
        "simulate", str(disagg), "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--out", str(tmp_path / "run")
    )
    assert code == 0, err
    assert "engine.disagg not simulated: --model/--gpu simulates one aggregated replica" in err, err
