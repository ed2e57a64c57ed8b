"""A server's tokenizer thread before its scheduler (kvplan.run.sim.cost.TextFrontEnd, vLLM's
AsyncMicrobatchTokenizer: one thread, batches of the prompts that arrive within 2 ms): release times
by hand, on the simulator's own backend, from ``gpu_setup`` and the plan entry; bad rates are one
line and exit 2."""

import math
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.run.driver import Submission
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.cost import FixedStepCost, ModelClock, TextFrontEnd
from kvplan.run.sim.gpu_target import gpu_setup, plan_setups
from kvplan.workload.file import load_workload, parse_workload
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[4]
SMOKE = ROOT / "workloads" / "smoke.yaml"
ENTRY = "  - {model: llama-3.1-8b, gpu: L4, kv_cache_dtype: fp8}\n"
STEP_S = 1e-3  # every step 1 ms (FixedStepCost), no gap
RATE_S = 1e-4  # 100 us per prompt token (short prompts: the tiny model holds 256 tokens)
WINDOW_S = 2e-3
ON_GPU = ("--model", "llama-3.1-8b", "--gpu", "H100-SXM")
BAD_ENTRY = "  - {model: llama-3.1-8b, gpu: H100-SXM, tokenize_us_per_token: -2}\n"


def test_a_batch_takes_the_prompts_that_arrive_within_the_window_and_leaves_after_all_their_tokens():
    front = TextFrontEnd(RATE_S, WINDOW_S, max_batch=3)
    # both by 0.002 (the first's arrival + the window), fewer than 3: closes at 0.002, leaves after
    # 10 + 20 tokens at 100 us: 0.002 + 0.003
    assert front.next_batch(0.0, [(0.0, 10), (0.0, 20)], math.inf) == (2, pytest.approx(0.005, abs=1e-15))
    # the same with arrivals known only up to 0.001: another could still join by 0.002
    assert front.next_batch(0.0, [(0.0, 10), (0.0, 20)], 0.001) is None
    # full at its 3rd prompt (arrived 0.0015): closes then, whatever is known; 60 tokens
    got = front.next_batch(0.0, [(0.0, 10), (0.001, 20), (0.0015, 30), (0.0018, 5)], 0.0)
    assert got == (3, pytest.approx(0.0015 + 0.006, abs=1e-15))
    # a prompt after the deadline settles it: the first alone, 0.002 + 0.001
    assert front.next_batch(0.0, [(0.0, 10), (0.005, 20)], 0.0) == (1, pytest.approx(0.003, abs=1e-15))
    # the thread busy until 0.010: it starts then, gathers up to 0.012 (the one at 0.011, not 0.013)
    got = front.next_batch(0.010, [(0.004, 10), (0.011, 20), (0.013, 5)], math.inf)
    assert got == (2, pytest.approx(0.012 + 0.003, abs=1e-15))


def _facts():
    from kvplan.run.sim.facts import simulated_facts

    workload = parse_workload(
        {
            "name": "front-end",
            "engine": {"model": "tiny-random-llama", "num_blocks": 256, "max_num_batched_tokens": 1024},
            "dataset": {"kind": "random"},
            "buckets": [{"name": "b", "input_tokens": 100, "output_tokens": 1, "concurrency": [1], "num_requests": 3}],
        }
    )
    return simulated_facts(workload, "cpu", "sdpa")


def _run(front_end, arrivals_and_prompts):
    """Each request (arrival s, prompt tokens) submitted in order, one output token each: the
    time each was first scheduled and finished, by index."""
    backend = SimBackend(_facts(), ModelClock(FixedStepCost(STEP_S), front_end=front_end))
    for i, (arrival, prompt) in enumerate(arrivals_and_prompts):
        backend.submit(Submission(f"b/closed/1/{i}", tuple(range(1, prompt + 1)), 1, i, "", arrival_time=arrival))
    done = {}
    while len(done) < len(arrivals_and_prompts):
        finished, _ = backend.advance(None)
        done.update({f.request_id: f for f in finished})
    ordered = [done[f"b/closed/1/{i}"] for i in range(len(done))]
    return [(f.first_scheduled_time, f.finish_time) for f in ordered]


def test_requests_reach_the_scheduler_when_their_batch_leaves_the_tokenizer_thread():
    # by hand: 10 and 20 tokens at 0 form one batch (the next arrives after 0.002): it leaves at
    # 0.002 + 0.003 = 0.005, both prompts in the step 0.005-0.006 (one token each); 30 at 0.010 ->
    # the thread idle since 0.005: 0.012 + 0.003 = 0.015, its step 0.015-0.016
    got = _run(TextFrontEnd(RATE_S, WINDOW_S), [(0.0, 10), (0.0, 20), (0.010, 30)])
    for (scheduled, finished), release in zip(got, (0.005, 0.005, 0.015)):
        assert scheduled == pytest.approx(release, abs=1e-12)
        assert finished == pytest.approx(release + STEP_S, abs=1e-12)
    # a short prompt in a long one's batch leaves with it: 100 + 1 tokens -> 0.002 + 0.0101
    got = _run(TextFrontEnd(RATE_S, WINDOW_S), [(0.0, 100), (0.001, 1)])
    assert [s for s, _ in got] == [pytest.approx(0.0121, abs=1e-12)] * 2
    # batches of at most 2, three prompts of 10 at 0: the first two fill one at 0 and leave at
    # 0.002; the third starts the next at 0.002, closes at 0.004 and leaves at 0.005
    got = _run(TextFrontEnd(RATE_S, WINDOW_S, max_batch=2), [(0.0, 10), (0.0, 10), (0.0, 10)])
    assert [s for s, _ in got] == [pytest.approx(t, abs=1e-12) for t in (0.002, 0.002, 0.005)]


def test_without_a_front_end_both_requests_share_the_first_step():
    got = _run(None, [(0.0, 10), (0.0, 20)])
    assert [s for s, _ in got] == [0.0, 0.0] and [f for _, f in got] == [STEP_S, STEP_S]


def test_gpu_setup_and_the_plan_entry_put_the_rate_on_the_clock(tmp_path):
    workload = load_workload(SMOKE)
    off = gpu_setup(workload, "llama-3.1-8b", "H100-SXM", step_times="roofline")
    on = gpu_setup(workload, "llama-3.1-8b", "H100-SXM", step_times="roofline", tokenize_us_per_token=3.3)
    assert getattr(off.clock(), "front_end", None) is None
    front = on.clock().front_end
    assert front.s_per_token == pytest.approx(3.3e-6, rel=1e-12) and front.window_s == 0.002
    assert "3.3 us per prompt token" in on.cost_model.description
    assert on.cost_model.parameters["tokenize_us_per_token"] == 3.3
    path = tmp_path / "w.yaml"
    path.write_text(
        SMOKE.read_text().replace(ENTRY, ENTRY + "  - {model: llama-3.1-8b, gpu: H100-SXM, tokenize_us_per_token: 5}\n")
    )
    setups, _ = plan_setups(load_workload(path))
    assert getattr(setups[0].clock(), "front_end", None) is None
    assert setups[1].clock().front_end.s_per_token == pytest.approx(5e-6, rel=1e-12)


@pytest.mark.parametrize("rate", [-1.0, float("nan"), float("inf")])
def test_gpu_setup_refuses_a_bad_rate(rate):
    with pytest.raises(KvplanError) as err:
        gpu_setup(load_workload(SMOKE), "llama-3.1-8b", "H100-SXM", step_times="roofline", tokenize_us_per_token=rate)
    assert err.value.field == "tokenize_us_per_token"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        ((*ON_GPU, "--tokenize-us-per-token", "-1"), "--tokenize-us-per-token: must"),
        ((*ON_GPU, "--tokenize-us-per-token", "nan"), "--tokenize-us-per-token: must"),
        (("--tokenize-us-per-token", "3"), "--tokenize-us-per-token: applies to a simulated GPU only"),
    ],
)
def test_bad_rates_on_the_command_line_get_one_line_and_exit_2(tmp_path, args, line):
    code, out, err = run_cli("simulate", str(SMOKE), "--out", str(tmp_path / "run"), *args)
    assert code == 2 and out == "" and line in err and err.count("\n") == 1, err


def test_a_bad_rate_in_a_plan_entry_gets_one_line_and_exit_2(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(SMOKE.read_text().replace(ENTRY, ENTRY + BAD_ENTRY))
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "run"))
    assert code == 2 and out == "" and "plan[1].tokenize_us_per_token" in err and err.count("\n") == 1, err


def test_a_simulation_with_the_thread_runs_closed_and_open_loops_and_keeps_each_request_behind_its_tokens(tmp_path):
    from kvplan.results.run_result import load_run
    from kvplan.run.sim.run import simulate

    workload = load_workload(SMOKE)  # closed loops of 1, 4 and 8 users and an open loop at 200 requests/s
    runs = {
        rate: load_run(
            simulate(
                workload,
                gpu_setup(workload, "llama-3.1-8b", "H100-SXM", step_times="roofline", tokenize_us_per_token=rate),
                tmp_path / f"run-{rate}",
                search=False,
            )
        ).requests
        for rate in (0.0, 100.0)
    }
    off, on = runs[0.0], runs[100.0]
    assert len(on) == len(off) > 0 and {r.mode for r in on} == {"closed", "open"}
    for r in on:  # its own tokens at 100 us each, at the least, before the scheduler sees it
        assert r.first_scheduled_time >= r.arrival_time + 100e-6 * r.num_prompt_tokens - 1e-12
    for level in {(r.mode, r.level) for r in on}:  # the thread keeps arrival order
        mine = sorted((r for r in on if (r.mode, r.level) == level), key=lambda r: r.arrival_time)
        firsts = [r.first_scheduled_time for r in mine]
        assert firsts == sorted(firsts)
    ttft = lambda records: sum(r.token_times[0] - r.arrival_time for r in records) / len(records)  # noqa: E731
    assert ttft(on) > ttft(off) + 0.002
