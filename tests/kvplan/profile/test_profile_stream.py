"""`kvplan profile` reads a log once, as a stream (kvplan.profile.stream): the same profile as the log
read whole (kvplan.profile.parsed + kvplan.profile.stats.profile_log, prefix reuse over every token
id), in memory bounded by the distinct prefix blocks; and the load over time, against hand counts."""

from __future__ import annotations

import importlib.util
import json
import random
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import kvplan.profile.stream as stream
from kvplan.profile.csv_traces import read_trace
from kvplan.profile.load import MAX_LISTED
from kvplan.profile.stats import profile_log
from kvplan.profile.stream import profile_stream
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.profile.test_profile_break_it import tiny_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def bench():
    """bench/profile_scale.py, whose generator writes the Mooncake conversation trace's shape."""
    spec = importlib.util.spec_from_file_location("profile_scale", ROOT / "bench" / "profile_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_same(path: Path, block_size: int = 16, tokenize=None) -> None:
    """Every ``--json`` key and every per-request array of the streamed profile equals the whole read's."""
    streamed = profile_stream(path, tokenize=tokenize, block_size=block_size)
    whole = profile_log(read_trace(path, tokenize=tokenize), block_size)
    assert set(streamed.data) == set(whole.data)
    for key in whole.data:
        assert json.dumps(streamed.data[key]) == json.dumps(whole.data[key]), key
    for name in ("arrivals_s", "input_tokens", "output_tokens", "think_times_s"):
        assert np.array_equal(getattr(streamed, name), getattr(whole, name)), name
    for name in ("reused_tokens", "shared_tokens", "reuse_by_block"):
        assert np.array_equal(getattr(streamed.prefix, name), getattr(whole.prefix, name)), name
    assert streamed.sessions == whole.sessions and streamed.notes == whole.notes


@pytest.mark.parametrize("block_size", [16, 100])
def test_a_4000_line_generated_slice_profiles_alike_streamed_and_whole(tmp_path, block_size):
    """The bench's conversation-shaped log (prompts scaled by 1/16 to keep the whole read light):
    block 0 shared by all, later turns sharing their history; 100-token blocks end inside 512-token
    hash blocks."""
    log = tmp_path / "slice.jsonl"
    made = bench().generate(log, 4000, seed=3, scale=1 / 16)
    assert made["requests"] == 4000
    assert_same(log, block_size)
    data = profile_stream(log, block_size=block_size).data
    assert 0.2 < data["prefix_reuse"] < 0.9 and data["top_prefixes"][0]["num_tokens"] == 512 // block_size * block_size


def test_a_log_out_of_order_is_read_in_arrival_order(tmp_path, monkeypatch):
    """Lines shuffled within 50 of their place stay in one pass (held back and sorted); shuffled
    through the whole file, the chains are read again in arrival order. Both equal the whole read."""
    monkeypatch.setattr(stream, "BATCH", 256)
    again = []
    real = stream._read_again
    monkeypatch.setattr(stream, "_read_again", lambda *a: again.append(1) or real(*a))
    log = tmp_path / "slice.jsonl"
    bench().generate(log, 3000, seed=4, scale=1 / 16)
    lines = log.read_text().splitlines()
    rng = random.Random(0)
    near = list(lines)
    for i in range(0, len(near) - 50, 50):
        part = near[i : i + 50]
        rng.shuffle(part)
        near[i : i + 50] = part
    anywhere = list(lines)
    rng.shuffle(anywhere)
    for name, rows, read_again in (("near", near, False), ("anywhere", anywhere, True)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(rows) + "\n")
        again.clear()
        assert_same(path)
        assert bool(again) is read_again, name


def test_conversations_with_text_profile_alike_in_any_order(tmp_path, monkeypatch):
    """OpenAI chat lines (a system prompt, history resent each turn), tokenized a chunk at a time;
    shuffled, their text is tokenized again for the second read."""
    monkeypatch.setattr(stream, "BATCH", 32)
    monkeypatch.setattr(stream, "CHUNK", 50)
    from kvplan.cli.profile import _lazy_tokenizer

    tokenize = _lazy_tokenizer(str(tiny_tokenizer(tmp_path / "tok")))
    rng = random.Random(5)
    words = [f"w{i}" for i in range(50)]
    rows, t = [], 0.0
    for conversation in range(120):
        history = [{"role": "system", "content": " ".join(rng.choice(words) for _ in range(40))}]
        for _ in range(rng.randint(1, 4)):
            t += rng.expovariate(2)
            history.append({"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(5, 60)))})
            reply = "ok " * rng.randint(1, 30)
            rows.append({"timestamp": t, "session_id": f"c{conversation}", "messages": list(history), "output": reply})
            history.append({"role": "assistant", "content": reply})
    rng.shuffle(rows)
    log = tmp_path / "chat.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for block_size in (16, 5):
        assert_same(log, block_size, tokenize)
    assert profile_stream(log, tokenize=tokenize).data["turns"]["max"] == 4


def peak_bytes(log: Path) -> int:
    """The peak of numpy's and Python's allocations (tracemalloc) while ``log`` is profiled."""
    tracemalloc.start()
    try:
        profile_stream(log)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_follows_the_distinct_blocks_not_the_tokens(tmp_path):
    """5,000 requests through the same 4 or the same 400 hash ids: 10 M or 1 G prompt tokens (8 GB of
    int64 token ids, were they kept), a handful of distinct blocks either way. The longer prompts
    cost the chains held back (8 bytes an id, some 2 M ids) and the index's work arrays (at most
    BATCH_UNITS units), not their tokens."""
    peaks = []
    for blocks in (4, 400):
        log = tmp_path / f"same{blocks}.jsonl"
        row = {"input_length": 512 * blocks, "output_length": 8, "hash_ids": list(range(1, blocks + 1))}
        log.write_text("".join(json.dumps({"timestamp": 100 * i, **row}) + "\n" for i in range(5000)))
        peaks.append(peak_bytes(log))
    assert peaks[1] < 150e6, peaks
    profile = profile_stream(log)
    assert profile.data["prefix_reuse"] == pytest.approx(4999 / 5000)  # all but the first request's blocks


def minute_log(tmp_path: Path, seconds: list[float]) -> Path:
    log = tmp_path / "times.jsonl"
    log.write_text(
        "".join(json.dumps({"timestamp": s * 1000, "input_length": 10, "output_length": 2}) + "\n" for s in seconds)
    )
    return log


def test_arrivals_per_minute_known_counts(tmp_path):
    """Minutes from the first arrival (at 5 s): 3, 0, 5 and 1 arrivals. P50 of [0, 1, 3, 5] is 2
    (halfway between 1 and 3), P99 3 + 0.97 x (5 - 3) = 4.94 (numpy's linear interpolation at
    0.99 x 3); the peak is minute 2's 5; under two hours, no hours."""
    seconds = [5, 20, 64.9] + [125, 130, 150, 160, 184.9] + [200]
    log = minute_log(tmp_path, seconds)
    code, out, err = run_cli("profile", str(log), "--json", "--plots", str(tmp_path / "plots"))
    assert code == 0, err
    load = json.loads(out)["load"]
    assert load["per_minute"] == [3, 0, 5, 1] and load["num_minutes"] == 4
    assert load["peak_per_minute"] == 5 and load["peak_minute"] == 2
    assert load["p50_per_minute"] == 2.0 and load["p99_per_minute"] == pytest.approx(4.94)
    assert load["mean_per_minute"] == 9 / 4 and load["start_s"] == 5.0
    assert load["per_hour"] is None and load["peak_per_hour"] is None
    assert (tmp_path / "plots" / "load.png").stat().st_size > 0
    code, out, _ = run_cli("profile", str(log))
    assert "arrivals per minute, P50 / P99 / peak" in out and "2 / 4.94 / 5 (minute 2 of 4)" in out


def test_a_log_over_two_hours_is_counted_per_hour_too(tmp_path):
    """Arrivals at 0, 10 and 3,599 s (hour 0), 3,600 s (hour 1) and 7,300 s (hour 2): 7,300 s is over
    the two hours past which hours are counted."""
    log = minute_log(tmp_path, [0, 10, 3599, 3600, 7300])
    code, out, err = run_cli("profile", str(log), "--json")
    assert code == 0, err
    load = json.loads(out)["load"]
    assert load["per_hour"] == [3, 1, 1] and load["num_hours"] == 3
    assert load["peak_per_hour"] == 3 and load["peak_hour"] == 0
    assert load["num_minutes"] == 7300 // 60 + 1 and load["peak_per_minute"] == 2
    code, out, _ = run_cli("profile", str(log))
    assert "Arrivals per hour" in out and "3 (hour 0 of 3)" in out


def test_a_log_over_years_lists_no_minutes_but_still_counts_them(tmp_path):
    """Two arrivals 10^9 s apart: 16,666,667 minutes, all but two empty, beyond what is listed."""
    log = minute_log(tmp_path, [0, 1e9])
    code, out, err = run_cli("profile", str(log), "--json")
    assert code == 0, err
    load = json.loads(out)["load"]
    assert load["num_minutes"] == 16_666_667 > MAX_LISTED and load["per_minute"] is None
    assert load["p99_per_minute"] == 0.0 and load["peak_per_minute"] == 1 and load["peak_minute"] == 0
    assert load["per_hour"] is None and load["num_hours"] == 277_778
