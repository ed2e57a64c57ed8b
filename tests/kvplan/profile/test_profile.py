"""`kvplan profile`: a request log's profile against answers known from how the log was built, the
workload it writes simulated back to the same traffic, and one line with exit 2 for a bad log."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from engine.config import DEFAULT_MODEL
from kvplan.cli.profile import DEFAULT_MODEL as CLI_DEFAULT
from kvplan.profile.log import LoggedRequest, ParsedLog, mooncake_block
from kvplan.profile.parsed import read_log
from kvplan.profile.stats import profile_log
from kvplan.workload.file import load_workload
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[3]
CONTRACT = {
    "num_requests",
    "num_bad_lines",
    "input_tokens",
    "output_tokens",
    "prefix_reuse",
    "arrival",
    "turns",
    "peak_in_flight",
}
Z = {"p50": 0.0, "p90": 1.2815515655446004, "p95": 1.6448536269514722, "p99": 2.3263478740408408}


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def profile_json(*args: str) -> dict:
    code, out, err = run_cli("profile", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_the_cli_default_model_is_the_engines():
    assert CLI_DEFAULT == DEFAULT_MODEL


def test_a_40_percent_shared_prefix_profiles_at_40_percent():
    """101 requests: the first is a 64-token prefix alone; each other one is that prefix (4 full
    blocks of 16) and its own unique tokens, 9,536 in all: reused 100 x 64 = 6,400 of
    64 x 101 + 9,536 = 16,000 prompt tokens = 40% exactly."""
    rng = np.random.default_rng(0)
    prefix = tuple(int(t) for t in rng.integers(0, 1000, 64))
    own = np.full(100, 95)
    own[:36] += 1  # 36 x 96 + 64 x 95 = 9,536
    requests = [LoggedRequest(1, "test", 0.0, 64, 8, token_ids=prefix)]
    next_id = 10_000  # own tokens never repeat, so no other block is seen twice
    for i, n in enumerate(own):
        ids = prefix + tuple(range(next_id, next_id + int(n)))
        next_id += int(n)
        requests.append(LoggedRequest(i + 2, "test", float(i + 1), len(ids), 8, token_ids=ids))
    assert sum(r.input_tokens for r in requests) == 16_000
    result = profile_log(ParsedLog("log", tuple(requests)), block_size=16)
    assert result.data["prefix_reuse"] == pytest.approx(0.40, abs=0.02)
    assert result.data["prefix_reuse"] == pytest.approx(6_400 / 16_000, abs=1e-12)
    assert result.data["shared_prefix"] == {"num_tokens": 64, "fraction": 1.0, "num_prefixes": 1}
    assert result.data["top_prefixes"][0]["num_requests"] == 101
    # block positions 0-3 reused in every request after the first, none after
    assert result.prefix.reuse_by_block[:4] == pytest.approx([100 / 101] * 4)
    assert not result.prefix.reuse_by_block[4:].any()


def test_mooncake_hash_ids_share_their_blocks(tmp_path):
    """Two requests sharing hash id 7 (512 tokens = 32 blocks of 16): the second reuses 512 of its
    600 tokens; the first (700 tokens) nothing: 512 / 1,300."""
    log = write_jsonl(
        tmp_path / "trace.jsonl",
        [
            {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [7, 8]},
            {"timestamp": 1500, "input_length": 600, "output_length": 9, "hash_ids": [7, 9]},
        ],
    )
    parsed = read_log(log)
    assert parsed.requests[0].token_ids[:512] == mooncake_block(7) == parsed.requests[1].token_ids[:512]
    assert parsed.requests[1].token_ids[512:] == mooncake_block(9)[:88]
    data = profile_json(str(log))
    assert data["prefix_reuse"] == pytest.approx(512 / 1300)
    assert data["arrival"]["rate_per_s"] == pytest.approx(1 / 1.5)  # timestamps in ms
    assert data["input_tokens"]["max"] == 700 and data["output_tokens"]["p50"] == 7


def test_lognormal_lengths_give_the_distributions_percentiles(tmp_path):
    rng = np.random.default_rng(1)
    mu_in, sigma_in, mu_out, sigma_out = math.log(400), 0.8, math.log(120), 0.4
    inputs = np.rint(rng.lognormal(mu_in, sigma_in, 5000)).astype(int)
    outputs = np.rint(rng.lognormal(mu_out, sigma_out, 5000)).astype(int)
    log = write_jsonl(
        tmp_path / "trace.jsonl",
        [
            {"timestamp": 100 * i, "input_length": int(a), "output_length": int(b), "hash_ids": []}
            for i, (a, b) in enumerate(zip(inputs, outputs))
        ],
    )
    data = profile_json(str(log), "--format", "mooncake")
    for side, mu, sigma in (("input_tokens", mu_in, sigma_in), ("output_tokens", mu_out, sigma_out)):
        for key, z in Z.items():
            assert data[side][key] == pytest.approx(math.exp(mu + sigma * z), rel=0.05), (side, key)
    # P99 / P50 = exp(2.326 sigma): 6.4 for the prompts, 2.5 for the outputs
    assert data["long_tail"] == {"input": True, "output": False, "rule": "p99 / p50 > 4"}
    assert data["turns"] is None and data["peak_in_flight"] is None and data["prefix_reuse"] == 0


def test_three_turn_sessions_have_three_turns_and_their_think_time(tmp_path):
    rows = []
    for s in range(30):
        for k in range(3):  # turn k at 10 s x s + 4 s x k, each taking 1 s: 3 s of thinking between turns
            rows.append(
                {
                    "timestamp": 10.0 * s + 4.0 * k,
                    "session_id": f"user-{s}",
                    "usage": {"prompt_tokens": 50 + 80 * k, "completion_tokens": 30},
                    "latency_s": 1.0,
                }
            )
    log = write_jsonl(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "w.yaml"
    data = profile_json(str(log), "--out", str(out))
    assert data["turns"] == {"mean": 3.0, "max": 3} and data["turns_source"] == "session_id"
    assert data["peak_in_flight"] == 1
    assert data["in_flight"]["mean"] == pytest.approx(90 / 299)  # 90 requests x 1 s from 0 s to 298 + 1 s
    workload = yaml.safe_load(out.read_text())
    assert workload["dataset"] == {"kind": "random", "sessions": {"max_turns": 3, "think_time_s": [3.0, 3.0]}}
    bucket = workload["buckets"][0]
    # each turn's new message: 50, then 130 - 50 - 30 = 50, then 210 - 130 - 30 = 50
    assert bucket["input_tokens"] == 50 and bucket["output_tokens"] == 30
    assert bucket["num_requests"] == 30 and bucket["request_rates"] == [pytest.approx(29 / 290)]
    assert bucket["arrival"] == {"process": "constant"}  # sessions every 10 s exactly
    load_workload(out)


@pytest.mark.smollm2
def test_messages_history_counts_user_turns_and_is_a_shared_prefix(tmp_path):
    rows, history = [], []
    for k in range(3):
        history = [*history, {"role": "user", "content": f"Question number {k}: " + "why is the sky blue? " * 20}]
        rows.append({"created": 1_700_000_000 + k, "messages": history, "output": "Because of Rayleigh scattering."})
        history = [*history, {"role": "assistant", "content": "Because of Rayleigh scattering."}]
    log = write_jsonl(tmp_path / "openai.jsonl", rows)
    data = profile_json(str(log))
    assert data["turns"] == {"mean": 3.0, "max": 3} and data["turns_source"] == "messages"
    assert data["prefix_reuse"] > 0.3  # turns 2 and 3 resend the history in front of their message
    from kvplan.traffic.tokenizer import tokenize_function

    (ids,) = tokenize_function(DEFAULT_MODEL)(["Because of Rayleigh scattering."])
    assert data["output_tokens"]["max"] == len(ids)


def test_a_poisson_log_has_cv_1_and_a_gamma_log_writes_its_burstiness(tmp_path):
    rng = np.random.default_rng(2)
    for shape, name in ((1.0, "poisson"), (0.25, "bursty")):
        gaps = rng.gamma(shape, 1 / (4.0 * shape), 1999)  # 4 req/s
        t = np.concatenate([[0.0], np.cumsum(gaps)])
        log = write_jsonl(
            tmp_path / f"{name}.jsonl",
            [{"timestamp": float(x), "usage": {"prompt_tokens": 40, "completion_tokens": 8}} for x in t],
        )
        out = tmp_path / f"{name}.yaml"
        data = profile_json(str(log), "--out", str(out))
        arrival = yaml.safe_load(out.read_text())["buckets"][0]["arrival"]
        assert data["arrival"]["rate_per_s"] == pytest.approx(1999 / t[-1])
        assert data["arrival"]["cv"] == pytest.approx(gaps.std() / gaps.mean())
        if shape == 1.0:
            assert data["arrival"]["cv"] == pytest.approx(1.0, abs=0.1)
            assert arrival == {"process": "poisson"}
        else:
            assert data["arrival"]["cv"] == pytest.approx(2.0, abs=0.2)
            assert arrival["process"] == "gamma"
            assert arrival["burstiness"] == pytest.approx(1 / data["arrival"]["cv"] ** 2, rel=1e-3)


def test_the_written_workload_simulates_to_the_logs_lengths_and_prefix_reuse(tmp_path):
    """5,000 Mooncake requests at 5 req/s: lognormal prompts and outputs, 40% of them behind one of
    two 512-token system prompts (hash ids 1 and 2), the rest unique. The workload it writes,
    simulated, sends the same length percentiles (5%) and hits the prefix cache as often (5 points)."""
    rng = np.random.default_rng(3)
    n = 5000
    own = np.clip(np.rint(rng.lognormal(math.log(250), 0.5, n)), 1, 1500).astype(int)
    outputs = np.clip(np.rint(rng.lognormal(math.log(60), 0.5, n)), 1, 400).astype(int)
    carries = rng.random(n) < 0.4
    t = np.cumsum(rng.exponential(0.2, n)) * 1000
    rows, next_hash = [], 100
    for i in range(n):
        length = int(own[i]) + (512 if carries[i] else 0)
        num_blocks = -(-length // 512)
        ids = [1 + i % 2] if carries[i] else []
        ids += list(range(next_hash, next_hash + num_blocks - len(ids)))
        next_hash += num_blocks
        rows.append({"timestamp": int(t[i]), "input_length": length, "output_length": int(outputs[i]), "hash_ids": ids})
    log = write_jsonl(tmp_path / "trace.jsonl", rows)
    out, sim = tmp_path / "w.yaml", tmp_path / "sim"
    data = profile_json(str(log), "--out", str(out))
    assert data["shared_prefix"]["num_tokens"] == 512 and data["shared_prefix"]["num_prefixes"] == 2
    assert data["shared_prefix"]["fraction"] == pytest.approx(carries.mean())
    code, _, err = run_cli("simulate", str(out), "--out", str(sim), "--quiet")
    assert code == 0, err
    records = [json.loads(line) for line in (sim / "requests.jsonl").read_text().splitlines()]
    cached = [r for r in records if r["variant"] == "cached"]
    assert len(cached) == n
    for side, key in (("input_tokens", "num_prompt_tokens"), ("output_tokens", "max_tokens")):
        simulated = np.percentile([r[key] for r in cached], [50, 90, 95, 99])
        logged = [data[side][p] for p in ("p50", "p90", "p95", "p99")]
        assert simulated == pytest.approx(logged, rel=0.05), side
    hit_rate = sum(r["num_cached_tokens"] for r in cached) / sum(r["num_prompt_tokens"] for r in cached)
    assert hit_rate == pytest.approx(data["prefix_reuse"], abs=0.05)


def test_a_kvplan_run_profiles_from_its_records():
    path = ROOT / "tests" / "kvplan" / "data" / "schema1" / "run" / "requests.jsonl"
    every = [json.loads(line) for line in path.read_text().splitlines()]
    same_level = lambda r: [r[k] for k in ("bucket", "mode", "level", "variant")]  # noqa: E731
    rows = [r for r in every if same_level(r) == same_level(every[0])]  # the first level only
    data = profile_json(str(path))
    first = every[0]
    assert data["level"] == f"{first['bucket']}/{first['mode']}/{first['level']:g}/{first['variant']}"
    assert len(data["levels"]) == len({tuple(same_level(r)) for r in every}) == 6
    assert data["formats"] == {"kvplan": len(rows)} and data["num_requests"] == len(rows)
    assert data["input_tokens"]["max"] == max(r["num_prompt_tokens"] for r in rows)
    assert data["output_tokens"]["max"] == max(r["max_tokens"] for r in rows)
    assert data["prefix_reuse"] == sum(r["num_cached_tokens"] for r in rows) / sum(r["num_prompt_tokens"] for r in rows)
    # peak in flight by brute force: at each arrival, the requests that arrived and have not finished
    peak = max(sum(1 for o in rows if o["arrival_time"] <= r["arrival_time"] < o["finish_time"]) for r in rows)
    assert data["peak_in_flight"] == peak


def test_bad_lines_are_counted_and_named(tmp_path):
    good = {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": []}
    log = write_jsonl(
        tmp_path / "trace.jsonl",
        [
            good,
            "{not json",
            {"input_length": 10, "output_length": 5, "hash_ids": []},
            {**good, "timestamp": 5, "input_length": -3},
            {**good, "timestamp": 9},
        ],
    )
    data = profile_json(str(log))
    assert data["num_requests"] == 2 and data["num_bad_lines"] == 3
    assert data["bad_lines"][0].startswith("line 2: json: not JSON")
    assert data["bad_lines"][1:] == ["line 3: timestamp: missing", "line 4: input_length: must be >= 0 (got -3)"]
    code, out, err = run_cli("profile", str(log))
    assert code == 0 and "bad line: line 3: timestamp: missing" in out


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "empty log"),
        ("\n  \n", "empty log"),
        ('{"input_length": 10, "output_length": 5}\nnope\n', "line 1: timestamp: missing"),
    ],
)
def test_a_log_without_a_good_line_is_one_line_and_exit_2(tmp_path, content, message):
    log = tmp_path / "log.jsonl"
    log.write_text(content)
    code, out, err = run_cli("profile", str(log))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: {log}: {message}") and "Traceback" not in err


def test_an_unreadable_log_and_a_bad_option_are_one_line_and_exit_2(tmp_path):
    for args in (
        [str(tmp_path / "missing.jsonl")],
        [str(tmp_path)],
        [
            str(write_jsonl(tmp_path / "l.jsonl", [{"timestamp": 0, "input_length": 1, "output_length": 1}])),
            "--format",
            "csv",
        ],
        [str(tmp_path / "l.jsonl"), "--block-size", "0"],
    ):
        code, out, err = run_cli("profile", *args)
        assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: "), (args, err)
    assert err.startswith("error: --block-size: must be >= 1")


def test_json_keys_are_the_contract(tmp_path):
    log = write_jsonl(
        tmp_path / "trace.jsonl",
        [{"timestamp": 1000 * i, "input_length": 20 + i, "output_length": 4, "hash_ids": []} for i in range(5)],
    )
    data = profile_json(str(log))
    assert CONTRACT <= set(data)
    for side in ("input_tokens", "output_tokens"):
        assert set(data[side]) == {"p50", "p90", "p95", "p99", "max"}
    assert set(data["arrival"]) == {"rate_per_s", "cv", "gamma_shape"}
    assert 0 <= data["prefix_reuse"] <= 1 and data["turns"] is None


def test_plots_are_written(tmp_path):
    log = write_jsonl(
        tmp_path / "trace.jsonl",
        [{"timestamp": 300 * i, "input_length": 600, "output_length": 4, "hash_ids": [0, i + 1]} for i in range(6)],
    )
    run_cli("profile", str(log), "--plots", str(tmp_path / "plots"), "--json")
    for name in ("lengths.png", "arrivals.png", "prefix_reuse.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"


def test_the_base_install_profiles_a_trace_without_torch(tmp_path):
    from tests.kvplan.test_base_install import PROGRAM, engine_only_modules

    log = write_jsonl(
        tmp_path / "trace.jsonl",
        [{"timestamp": 250 * i, "input_length": 600, "output_length": 4, "hash_ids": [0, i + 1]} for i in range(8)],
    )
    commands = [["profile", str(log), "--json", "--out", str(tmp_path / "w.yaml")]]
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, json.dumps(sorted(engine_only_modules())), json.dumps(commands)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (code, out, err), imported = json.loads(done.stdout.splitlines()[-1])
    assert code == 0, err
    assert json.loads(out)["prefix_reuse"] == pytest.approx(7 * 512 / (8 * 600))
    assert imported == []


def test_a_kvplan_run_profiles_one_level_on_its_own_clock(tmp_path):
    def record(level, i, arrival):
        return {
            "request_id": f"b/open/{level}/{i}",
            "bucket": "b",
            "mode": "open",
            "level": level,
            "arrival_time": arrival,
            "finish_time": arrival + 0.5,
            "num_prompt_tokens": 10 * level,
            "max_tokens": 4,
            "num_cached_tokens": 0,
        }

    # two levels, each clock starting at 0: level 1 sends every 1 s, level 2 every 0.5 s
    rows = [record(1, i, float(i)) for i in range(5)] + [record(2, i, 0.5 * i) for i in range(5)]
    log = write_jsonl(tmp_path / "requests.jsonl", rows)
    first = profile_json(str(log))
    assert first["level"] == "b/open/1" and first["levels"] == ["b/open/1", "b/open/2"]
    assert first["num_requests"] == 5 and first["arrival"]["rate_per_s"] == pytest.approx(1.0)
    assert first["peak_in_flight"] == 1
    second = profile_json(str(log), "--level", "b/open/2")
    assert second["arrival"]["rate_per_s"] == pytest.approx(2.0) and second["input_tokens"]["max"] == 20
    assert second["peak_in_flight"] == 1  # finish at arrival + 0.5 s = the next arrival: counted first
    assert profile_json(str(log), "--level", "all")["num_requests"] == 10
    code, out, err = run_cli("profile", str(log), "--level", "b/open/3")
    assert code == 2 and err.startswith(f"error: {log}: level: 'b/open/3' is not a level of the run")


def test_openai_iso_timestamps_and_e2e_ms(tmp_path):
    rows = [
        {
            "timestamp": f"2026-12-01T10:00:0{k}Z",
            "prompt_tokens_ignored": 1,
            "usage": {"prompt_tokens": 100, "completion_tokens": 10},
            "e2e_ms": 2500,
        }
        for k in range(4)
    ]
    data = profile_json(str(write_jsonl(tmp_path / "openai.jsonl", rows)))
    assert data["arrival"]["rate_per_s"] == pytest.approx(1.0) and data["arrival"]["cv"] == pytest.approx(0.0)
    assert data["peak_in_flight"] == 3  # each 2.5 s long, one a second
    assert data["in_flight"]["mean"] == pytest.approx(4 * 2.5 / 5.5)


def test_replay_writes_the_log_as_a_trace_sharing_what_the_log_shared(tmp_path):
    source = Path(__file__).resolve().parents[3] / "workloads" / "traces" / "mooncake_conversation_100.jsonl"
    out = tmp_path / "replay.yaml"
    code, _, err = run_cli("profile", str(source), "--out", str(out), "--replay")
    assert code == 0, err
    workload = load_workload(out)
    assert workload.dataset.kind == "trace" and [b.name for b in workload.buckets] == ["trace"]
    original = [json.loads(line) for line in source.read_text().splitlines()]
    replayed = [json.loads(line) for line in (tmp_path / "replay.trace.jsonl").read_text().splitlines()]

    def relabelled(ids):  # hash ids by first appearance: the sharing, whatever the labels
        seen: dict[int, int] = {}
        return [[seen.setdefault(h, len(seen)) for h in row] for row in ids]

    assert [(r["input_length"], r["output_length"]) for r in replayed] == [
        (r["input_length"], r["output_length"]) for r in original
    ]
    assert [r["timestamp"] for r in replayed] == [r["timestamp"] - original[0]["timestamp"] for r in original]
    # the trace's last block may be partial: the replay keys a block by its tokens, the trace by its id
    trimmed = [r["hash_ids"][: -(-r["input_length"] // 512)] for r in original]
    assert relabelled([r["hash_ids"] for r in replayed]) == relabelled(trimmed)
    code, _, err = run_cli("profile", str(source), "--replay")
    assert code == 2 and "replay: writes a workload, and no --out was given" in err


def test_replay_of_a_non_mooncake_log_keeps_sharing_below_512_tokens(tmp_path):
    from kvplan.profile.replay import trace_lines

    rng = np.random.default_rng(1)
    prefix = tuple(int(t) for t in rng.integers(0, 500, 144))  # 9 full blocks of 16, under one 512 block
    requests = [
        LoggedRequest(i + 1, "openai", float(i), 144 + 20, 4, token_ids=prefix + tuple(range(1000 * i, 1000 * i + 20)))
        for i in range(3)
    ]
    rows = trace_lines(ParsedLog("log", tuple(requests)), 16)
    assert [r["hash_ids"][:9] for r in rows] == [list(range(9))] * 3  # the prefix's 9 blocks, shared
    assert len({r["hash_ids"][9] for r in rows}) == 3  # each request's own tokens, its own block
    assert trace_lines(ParsedLog("log", tuple(requests)), 512)[1]["hash_ids"] == [1]  # one 512 block: none shared


def test_huge_lengths_are_bad_lines_evenly_spaced_arrivals_are_constant_and_a_bad_plots_folder_is_one_line(tmp_path):
    rows = [{"timestamp": 100 * i, "input_length": 32, "output_length": 8, "hash_ids": [i]} for i in range(5)]
    rows.append({"timestamp": 600, "input_length": 10**23, "output_length": 8, "hash_ids": [9]})
    log = write_jsonl(tmp_path / "even.jsonl", rows)
    data = profile_json(str(log), "--out", str(tmp_path / "w.yaml"))
    assert data["num_bad_lines"] == 1 and data["arrival"]["cv"] == 0.0 and data["arrival"]["gamma_shape"] is None
    assert yaml.safe_load((tmp_path / "w.yaml").read_text())["buckets"][0]["arrival"] == {"process": "constant"}
    (tmp_path / "afile").write_text("")
    code, out, err = run_cli("profile", str(log), "--plots", str(tmp_path / "afile"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "plots: cannot make the folder" in err
