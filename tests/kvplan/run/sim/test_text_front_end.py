"""A server's tokenizer thread before its scheduler (kvplan.run.sim.cost.TextFrontEnd, vLLM's
AsyncMicrobatchTokenizer as one FIFO queue): release times by hand, on the simulator's own backend,
from ``gpu_setup`` and the plan entry; bad rates are one line and exit 2."""

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


def test_release_is_the_later_of_arrival_plus_window_and_the_previous_release_plus_the_prompt():
    front = TextFrontEnd(RATE_S, WINDOW_S)
    assert front.release(0.0, 0.0, 10) == pytest.approx(0.002 + 0.001, abs=1e-15)  # idle thread: window, then 10 tokens
    assert front.release(0.003, 0.0, 20) == pytest.approx(0.003 + 0.002, abs=1e-15)  # queued behind the first
    assert front.release(0.005, 0.010, 30) == pytest.approx(0.012 + 0.003, abs=1e-15)  # the thread idle again
    assert TextFrontEnd(0.0, 0.0).release(0.0, 0.25, 10_000) == 0.25


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


def test_requests_reach_the_scheduler_when_the_tokenizer_thread_releases_them_in_arrival_order():
    # by hand: 10 tokens at 0 -> 0.002 + 0.001 = 0.003; 20 at 0 -> queued, 0.003 + 0.002 = 0.005;
    # 30 at 0.010 -> the thread idle since 0.005: 0.012 + 0.003 = 0.015. Each then one 1 ms step
    # (its whole prompt and its one token), the scheduler idle in between.
    got = _run(TextFrontEnd(RATE_S, WINDOW_S), [(0.0, 10), (0.0, 20), (0.010, 30)])
    for (scheduled, finished), release in zip(got, (0.003, 0.005, 0.015)):
        assert scheduled == pytest.approx(release, abs=1e-12)
        assert finished == pytest.approx(release + STEP_S, abs=1e-12)
    # a short prompt behind a long one keeps its place: 100 tokens then 1, both at 0. The first
    # leaves at 0.002 + 0.010 = 0.012 and runs 0.012-0.013; the second leaves at 0.012 + 0.0001
    # while that step runs, so it joins the next one, at 0.013
    (s1, _), (s2, _) = _run(TextFrontEnd(RATE_S, WINDOW_S), [(0.0, 100), (0.0, 1)])
    assert s1 == pytest.approx(0.012, abs=1e-12) and s2 == pytest.approx(0.013, abs=1e-12)


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
