"""A trace longer than a day (kvplan.workload.trace.check_replay): a generated 3-day trace in the
Azure 2024 week-long traces' shape (ISO times with a +00:00 offset) is read, profiled hour by hour,
and sized window by window by ``kvplan plan --window``; replaying it whole as one level (simulate)
is refused in one line, exit 2, saying why and what to do instead."""

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.kvplan.cli_runner import run_cli

WINDOW_S = 6 * 3600.0
DAYS = 3
# arrivals in each 6 h window of a day: night, morning, afternoon, evening (the same each day)
SHAPE = [3, 9, 12, 6]
START = datetime(2024, 5, 10, tzinfo=UTC)
ENGINE = "engine: {model: SmolLM2-135M-Instruct, block_size: 16, max_model_len: 2048}\n"
PLAN = ["--model", "llama-3.1-8b", "--gpus", "H100-SXM", "--tp", "1", "--max-num-batched-tokens", "8192"]


def _times() -> list[datetime]:
    """SHAPE[k] arrivals evenly spaced in each window k of each day, the first at the trace's start."""
    out = []
    for w in range(DAYS * len(SHAPE)):
        n = SHAPE[w % len(SHAPE)]
        out += [START + timedelta(seconds=w * WINDOW_S + j * WINDOW_S / n) for j in range(n)]
    return out


def _trace(folder: Path) -> Path:
    rows = [f"{t.isoformat(sep=' ')},{100 + k % 7},{20 + k % 5}\n" for k, t in enumerate(_times())]
    (folder / "week.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows))
    path = folder / "week.yaml"
    slo = "slo: {ttft_ms: 500, tpot_ms: 50}\n"
    path.write_text(
        f"name: week\nseed: 0\n{ENGINE}dataset: {{kind: trace, path: week.csv}}\n{slo}buckets:\n  - name: w\n"
    )
    return path


def test_the_times_span_three_days():
    times = _times()
    assert len(times) == 3 * 30 and (times[-1] - times[0]).total_seconds() == pytest.approx(72 * 3600 - 6 * 3600 / 6)


def test_plan_window_sizes_a_three_day_trace(tmp_path):
    workload = _trace(tmp_path)
    args = [*PLAN, "--window", str(WINDOW_S), "--jobs", "1", "--json", "--out", str(tmp_path / "plan")]
    code, out, err = run_cli("plan", str(workload), *args)
    assert code == 0, err
    windows = json.loads(out)["windows"]["windows"]
    counts = SHAPE * DAYS
    assert [w["num_requests"] for w in windows] == counts
    assert [w["start_s"] for w in windows] == [k * WINDOW_S for k in range(12)]
    assert [w["rate"] for w in windows] == pytest.approx([c / WINDOW_S for c in counts])
    for w in windows:  # a few requests an hour: one replica holds each window
        assert w["meets_slo"] and w["replicas"] == max(1, math.ceil(w["rate"] / w["slo_max_request_rate"])) == 1


def test_profile_counts_a_three_day_trace_by_the_hour(tmp_path):
    _trace(tmp_path)
    code, out, err = run_cli("profile", str(tmp_path / "week.csv"), "--json")
    assert code == 0, err
    load = json.loads(out)["load"]
    per_hour = [0] * 72
    for t in _times():
        per_hour[int((t - START).total_seconds() // 3600)] += 1
    assert load["num_hours"] == 72 and load["per_hour"] == per_hour
    assert load["peak_per_hour"] == max(per_hour) == 2  # 12 arrivals over 6 h, one each half hour


def test_a_whole_replay_over_a_day_is_one_line_exit_2(tmp_path):
    workload = _trace(tmp_path)
    code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / "run"))
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "dataset.speed: line 91 arrives 71 h in: a whole replay is one level, at most 24 h" in lines[0]
    assert "kvplan plan --window 3600" in lines[0] and not (tmp_path / "run").exists()
    fast = workload.read_text().replace("path: week.csv", "path: week.csv, speed: 3")
    (tmp_path / "fast.yaml").write_text(fast)  # 71 h / 3 = 23.7 h: one level again
    code, out, err = run_cli("simulate", str(tmp_path / "fast.yaml"), "--out", str(tmp_path / "fast"), "--quiet")
    assert code == 0, err
