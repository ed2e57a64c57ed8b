"""``kvplan plan --window``: a trace sized window by window (kvplan.optimize.plan_windows).

A generated day with a known diurnal shape (12 windows, compressed to 10 s each so the test runs
in seconds: the sizing does not depend on the window's length, only on its requests and rate)
gives replicas per window that follow the shape; every window of the best configuration meets
the SLO when its own arrivals, split round robin over its replicas, are simulated again by
``kvplan simulate`` apart from the search; the costs are the hand arithmetic of the module's rule.
"""

import json
import math
import random
from pathlib import Path

import pandas as pd
import pytest

from kvplan.optimize.plan_windows import costs, judged_lines, split_windows
from kvplan.workload.trace import Trace, TraceRequest
from tests.kvplan.cli_runner import run_cli

WINDOW_S = 10.0
# arrivals per second in each window: a day's trough, morning rise, midday peak, evening fall
SHAPE = [6, 4, 4, 10, 30, 60, 100, 120, 90, 60, 30, 12]
ENGINE = """engine:
  model: SmolLM2-135M-Instruct
  block_size: 16
  max_model_len: 2048
  max_num_seqs: 256
  max_num_batched_tokens: 8192
"""
SLO = "slo: {ttft_ms: 500, tpot_ms: 50}\n"
PLAN = ["--model", "llama-3.1-8b", "--gpus", "H100-SXM", "--tp", "1", "--max-num-batched-tokens", "8192"]


def _day(path: Path) -> list[dict]:
    """Poisson arrivals at SHAPE's rate in each window, 512 tokens in and 64 out, no shared block."""
    rng = random.Random(7)
    lines: list[dict] = []
    for w, rate in enumerate(SHAPE):
        t = w * WINDOW_S
        while True:
            t += rng.expovariate(rate)
            if t >= (w + 1) * WINDOW_S:
                break
            n = len(lines)
            lines.append({"timestamp": round(t * 1000, 3), "input_length": 512, "output_length": 64, "hash_ids": [n]})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def _workload(folder: Path, name: str, trace: str) -> Path:
    path = folder / f"{name}.yaml"
    text = f"name: {name}\nseed: 0\n{ENGINE}dataset: {{kind: trace, path: {trace}}}\n{SLO}buckets:\n  - name: w\n"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    folder = tmp_path_factory.mktemp("day")
    lines = _day(folder / "day.jsonl")
    workload = _workload(folder, "day", "day.jsonl")
    run_dir = folder / "plan"
    args = [*PLAN, "--window", str(WINDOW_S), "--window-requests", "150", "--scale-up-s", "4"]
    code, out, err = run_cli("plan", str(workload), *args, "--jobs", "1", "--json", "--out", str(run_dir))
    assert code == 0, err
    return folder, lines, json.loads(out), run_dir


def test_replicas_per_window_follow_the_shape(day):
    _, lines, run, _ = day
    plan = run["windows"]
    windows = plan["windows"]
    first = lines[0]["timestamp"] / 1000
    counts = [sum(1 for x in lines if int((x["timestamp"] / 1000 - first) // WINDOW_S) == k) for k in range(12)]
    assert [w["num_requests"] for w in windows] == counts
    assert [w["rate"] for w in windows] == pytest.approx([c / WINDOW_S for c in counts])
    assert [w["judged_requests"] for w in windows] == [min(c, 150) for c in counts]
    for w in windows:  # ceil(rate / capacity per replica), at least one
        assert w["meets_slo"] and w["replicas"] == max(1, math.ceil(w["rate"] / w["slo_max_request_rate"] - 1e-9))
    replicas = [w["replicas"] for w in windows]
    # the shape: the peak window needs the most, the trough the fewest, and more arrivals never fewer replicas
    peak, trough = SHAPE.index(max(SHAPE)), SHAPE.index(min(SHAPE))
    assert replicas[peak] == max(replicas) >= 3 and replicas[trough] == min(replicas) == 1
    by_rate = sorted(range(12), key=lambda k: counts[k])
    assert [replicas[k] for k in by_rate] == sorted(replicas)
    # the grid was ranked at the busiest window's rate, and its best is the one sized
    assert run["load"] == {"rate": pytest.approx(max(counts) / WINDOW_S)}
    assert (plan["gpu"], plan["tp"]) == (run["best"]["gpu"], run["best"]["tp"])
    assert plan["static_replicas"] == max(replicas)


def test_costs_are_the_rule_by_hand(day):
    _, _, run, _ = day
    plan = run["windows"]
    replicas = [w["replicas"] for w in plan["windows"]]
    price = plan["usd_per_gpu_hour"]
    assert price and price == pytest.approx(run["best"]["usd_per_hour"] / run["best"]["num_gpus"])
    ups = sum(max(0, b - a) for a, b in zip(replicas, replicas[1:], strict=False))
    assert plan["static_usd"] == pytest.approx(max(replicas) * price * 12 * WINDOW_S / 3600)
    assert plan["following_usd"] == pytest.approx((sum(replicas) * WINDOW_S + ups * 4) * price / 3600)
    assert plan["following_usd"] < plan["static_usd"]


def test_every_window_meets_the_slo_simulated_apart(day):
    """Each window's own arrivals, every R-th one (R = its replicas: one replica's share under
    round robin), replayed at their recorded times by ``kvplan simulate`` on the best configuration."""
    folder, lines, run, _ = day
    best = run["best"]
    first = lines[0]["timestamp"] / 1000
    for w in run["windows"]["windows"]:
        own = [x for x in lines if int((x["timestamp"] / 1000 - first) // WINDOW_S) == w["index"]]
        share = own[:: w["replicas"]]
        trace = folder / f"window{w['index']}.jsonl"
        trace.write_text("".join(json.dumps(x) + "\n" for x in share))
        workload = _workload(folder, f"window{w['index']}", trace.name)
        args = ["--model", "llama-3.1-8b", "--gpu", best["gpu"], "--tp", str(best["tp"]), "--json", "--quiet"]
        code, out, err = run_cli("simulate", str(workload), *args, "--out", str(folder / f"sim{w['index']}"))
        assert code == 0, err
        level = json.loads(out)["buckets"][0]["levels"][0]
        assert level["num_completed"] == len(share)
        assert level["slo_attainment"] >= run["attainment"], (w, level["slo_attainment"])


def test_run_folder_views_rebuild(day):
    _, _, run, run_dir = day
    frame = pd.read_csv(run_dir / "windows.csv")
    assert list(frame["replicas"]) == [w["replicas"] for w in run["windows"]["windows"]]
    assert (run_dir / "windows.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (run_dir / "summary.md").read_text()
    assert "## Windows" in summary and f"${run['windows']['static_usd']:,.2f}" in summary
    (run_dir / "windows.csv").unlink()
    code, _, err = run_cli("report", str(run_dir))
    assert code == 0, err
    assert pd.read_csv(run_dir / "windows.csv").equals(frame)


def test_split_and_judged_by_hand():
    offsets = [5.0, 5.5, 14.9, 15.0, 40.0]
    trace = Trace(tuple(TraceRequest(i + 1, t, 10, 10, None) for i, t in enumerate(offsets)))
    windows = split_windows(trace, 10.0)  # from the first arrival (5 s): [5,15) [15,25) [25,35) [35,45)
    assert [w.lines for w in windows] == [(0, 1, 2), (3,), (), (4,)]
    assert [w.start_s for w in windows] == [0.0, 10.0, 20.0, 30.0]
    assert [w.rate for w in windows] == [0.3, 0.1, 0.0, 0.1]
    assert judged_lines(range(10), 4) == (0, 2, 5, 7) and judged_lines((3, 4), 4) == (3, 4)
    assert [w.lines for w in split_windows(trace, 35.0)] == [(0, 1, 2, 3), (4,)]  # the span, 35 s: two windows


@pytest.mark.parametrize(
    ("window_s", "line"),
    [
        # once one window of 1e9 s at 5 / 1e9 req/s: a plan of 0 replicas, a static cost for 31 years
        (1e9, "window: 1e+09 s is longer than the trace's 35 s (its first to last arrival)"),
        (35.001, "window: 35.001 s is longer than the trace's 35 s"),
        # once 35 million windows built and judged one by one (no end in sight)
        (
            1e-6,
            "window: 1e-06 s cuts the trace's 35 s into over 10,000 windows, each judged by simulation;"
            " give a window >= 0.0035 s",
        ),
    ],
)
def test_a_window_longer_than_the_trace_or_too_short_is_refused(window_s, line):
    from kvplan.errors import KvplanError

    trace = Trace(tuple(TraceRequest(i + 1, t, 10, 10, None) for i, t in enumerate([5.0, 5.5, 14.9, 15.0, 40.0])))
    with pytest.raises(KvplanError) as caught:
        split_windows(trace, window_s)
    assert str(caught.value).startswith(line), caught.value


def test_costs_hand_numbers():
    # replicas 1,1,2,3,2,1 of tp 2 at $2/GPU-hour, hour windows, 600 s scale-up: static 3 x 2 x 2 x 6 h;
    # following (10 replica-hours + 2 scale-ups x 1/6 h) x 2 GPUs x $2
    static, following = costs([1, 1, 2, 3, 2, 1], 2, 2.0, 3600.0, 600.0)
    assert static == pytest.approx(72.0) and following == pytest.approx((10 + 2 / 6) * 4)
    assert costs([1, 2], 1, None, 3600.0, 0.0) == (None, None)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--window", "0"], "--window"),
        (["--window", "10", "--rate", "5"], "--window"),
        (["--window", "10", "--scale-up-s", "-1"], "--scale-up-s"),
        (["--window", "10", "--window-requests", "0"], "--window-requests"),
        # once ignored without --window: exit 0, a plan of the --rate, the setting read by nothing
        (["--rate", "5", "--scale-up-s", "60"], "--scale-up-s: applies with --window only"),
        (["--rate", "5", "--window-requests", "100"], "--window-requests: applies with --window only"),
    ],
)
def test_bad_window_settings_are_one_line(tmp_path, extra, field):
    lines = _day(tmp_path / "day.jsonl")
    assert lines
    workload = _workload(tmp_path, "day", "day.jsonl")
    code, _, err = run_cli("plan", str(workload), *PLAN, *extra, "--out", str(tmp_path / "run"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and field in err, err


def test_window_needs_a_trace(tmp_path):
    chat = Path(__file__).resolve().parents[3] / "workloads" / "chat.yaml"
    code, _, err = run_cli("plan", str(chat), *PLAN, "--window", "3600", "--out", str(tmp_path / "run"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "window" in err and "trace" in err, err


def test_the_busiest_window_is_the_grids_own_answer(day, monkeypatch):
    """The busiest window is not judged again (its job is the grid's for the best configuration):
    its row equals a fresh judgement of that window's own job, and the other windows go out the most
    judged requests and the highest rate first."""
    from kvplan.optimize import plan as planning
    from kvplan.optimize import plan_pool, plan_windows
    from kvplan.results.plan_result import ConfigResult
    from kvplan.run.sim.facts import model_config
    from kvplan.workload.file import load_workload

    folder, _, run, _ = day
    spec = load_workload(folder / "day.yaml")
    vocab = model_config(spec.engine.model).get("vocab_size") or 1
    windowed = plan_windows.TraceWindows(spec, 0, vocab, WINDOW_S, 150, "llama-3.1-8b")
    top = plan_windows.busiest(windowed.windows)
    best = ConfigResult.model_validate(run["best"])
    fresh = planning.judge(
        planning.Job(
            windowed.busiest_spec,
            "llama-3.1-8b",
            0,
            plan_windows.best_config(best),
            windowed.busiest,
            windowed.busiest_rate,
            None,
            run["attainment"],
            None,
        )
    )
    row = run["windows"]["windows"][top.index]
    assert (row["slo_max_request_rate"], row["replicas"]) == (fresh.slo_max_request_rate, fresh.replicas)
    assert (fresh.slo_max_request_rate, fresh.replicas) == (best.slo_max_request_rate, best.replicas)
    sent = []

    def spy(jobs, workers, ray, done):
        sent.append([job.rate for job in jobs])
        return plan_pool.Outcome([])

    monkeypatch.setattr(plan_pool, "run_jobs", spy)
    plan, _ = windowed.judge(best, run["attainment"], 4.0, None, 2, None)
    (order,) = sent
    rates = sorted((w.rate for w in windowed.jobs if w.index != top.index), reverse=True)
    assert order == rates and len(order) == len(windowed.jobs) - 1
    assert plan.windows[top.index].replicas == best.replicas  # the others, not judged here, read as unmet
    assert sum(w.meets_slo for w in plan.windows) == 1


def test_a_best_with_a_host_tier_keeps_it_in_every_window(day, monkeypatch):
    """A best configuration with a host KV tier (``--host-offload-gib``) is judged on the other
    windows with that tier (before: ``best_config`` dropped it, so windows were sized without it),
    and its busiest window is the grid's own answer, as for a replica without one."""
    from kvplan.optimize import plan_pool, plan_windows
    from kvplan.results.plan_result import ConfigResult
    from kvplan.run.sim.facts import model_config
    from kvplan.workload.file import load_workload

    folder, _, run, _ = day
    spec = load_workload(folder / "day.yaml")
    vocab = model_config(spec.engine.model).get("vocab_size") or 1
    windowed = plan_windows.TraceWindows(spec, 0, vocab, WINDOW_S, 150, "llama-3.1-8b")
    best = ConfigResult.model_validate(run["best"]).model_copy(update={"host_offload_gib": 64.0})
    assert plan_windows.best_config(best).host_offload_gib == 64.0
    assert plan_windows.best_config(ConfigResult.model_validate(run["best"])).host_offload_gib == 0.0
    sent = []

    def spy(jobs, workers, ray, done):
        sent.append(jobs)
        return plan_pool.Outcome([])

    monkeypatch.setattr(plan_pool, "run_jobs", spy)
    plan, _ = windowed.judge(best, run["attainment"], 4.0, None, 2, None)
    (jobs,) = sent
    assert len(jobs) == len(windowed.jobs) - 1
    assert {job.config.host_offload_gib for job in jobs} == {64.0}
    top = plan_windows.busiest(windowed.windows).index
    assert plan.windows[top].replicas == best.replicas
