"""Multi-turn sessions (``dataset.sessions``): each turn's prompt extends the one before with the
recorded reply (random ids on the tiny model; ShareGPT-style text in SmolLM2's real chat template),
the driver's users wait and think, the prefix cache serves each turn its history's blocks, the
simulator replays a session run step for step, and the per-turn summary is what the records say."""

import json
import math
from pathlib import Path

import jinja2
import numpy as np
import pytest

from kvplan.results.run_result import load_run
from kvplan.run.loadtest import run_loadtest
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import replay_setup
from kvplan.sizing.models.gguf_reader import read_gguf_header
from kvplan.traffic import prompts, samples
from kvplan.traffic.prompts import sample_buckets
from kvplan.traffic.sessions import SYSTEM
from kvplan.traffic.tokenizer import smollm2_gguf, tokenize_function
from kvplan.workload.file import load_workload, parse_workload
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.run.sim.test_exactness import SAME, by_level

ROOT = Path(__file__).resolve().parents[3]
WORKLOAD = ROOT / "tests" / "kvplan" / "data" / "sessions_tiny.yaml"
BAD = Path(__file__).resolve().parents[1] / "data" / "bad_workloads"
BLOCK = 4  # sessions_tiny.yaml's block_size


def sessions_of(requests):
    """Session index -> its requests in turn order."""
    out = {}
    for r in requests:
        out.setdefault(r.session, []).append(r)
    return {s: sorted(turns, key=lambda r: r.turn) for s, turns in out.items()}


@pytest.fixture(scope="module")
def workload():
    return load_workload(WORKLOAD)


@pytest.fixture(scope="module")
def sampled(workload):
    return sample_buckets(workload, None, 512).requests["chat"]


def covers_preemption_and_hits(run) -> bool:
    """Whether a measured run preempted in its closed loop and served prefix hits: what the replay
    test needs to cover. Both hang on wall-clock overlap of the users' turns, so a loaded machine
    can miss them."""
    steps = run.steps
    return (
        sum(s.num_preemptions for s in steps if s.mode == "closed") > 0
        and sum(s.num_prefix_hit_tokens for s in steps) > 0
    )


@pytest.fixture(scope="module")
def measured(workload, tmp_path_factory):
    """The first of up to 3 load tests of sessions_tiny.yaml that covers preemption and hits."""
    for attempt in range(3):
        run = load_run(run_loadtest(workload, tmp_path_factory.mktemp("sessions") / f"run{attempt}"))
        if covers_preemption_and_hits(run):
            break
    return run


def test_random_turns_extend_the_previous_prompt_by_its_reply(workload, sampled):
    spec, bucket = workload.dataset.sessions, workload.buckets[0]
    sessions = sessions_of(sampled)
    assert sorted(sessions) == list(range(bucket.num_requests))  # num_requests counts sessions
    for turns in sessions.values():
        assert [r.turn for r in turns] == list(range(1, spec.max_turns + 1))
        assert turns[0].think_time_s == 0.0 and all(0.01 <= r.think_time_s <= 0.03 for r in turns[1:])
        first = turns[0]
        assert bucket.input_tokens.min <= first.num_prompt_tokens <= bucket.input_tokens.max
        for before, after in zip(turns, turns[1:]):
            assert bucket.output_tokens.min <= before.max_tokens <= bucket.output_tokens.max
            # no template on random ids: the previous prompt, its reply (max_tokens ids), message k
            assert after.prompt_token_ids[: before.num_prompt_tokens] == before.prompt_token_ids
            own = after.num_prompt_tokens - before.num_prompt_tokens - before.max_tokens
            assert bucket.input_tokens.min <= own <= bucket.input_tokens.max
    assert sample_buckets(workload, None, 512).requests["chat"] == sampled  # deterministic for the seed


CONVERSATIONS = [
    {"conversations": [{"from": "gpt", "value": "ignored opener"}]},  # no human turn
    {
        "conversations": [
            {"from": "human", "value": "What is a KV cache?"},
            {"from": "gpt", "value": "It keeps the keys and values of past tokens."},
            {"from": "human", "value": "Why page it?"},
            {"from": "gpt", "value": "So memory is not reserved for the longest request."},
            {"from": "human", "value": "Thanks!"},
            {"from": "gpt", "value": "You are welcome."},
        ]
    },
    {
        "conversations": [
            {"from": "human", "value": "Name a prime."},
            {"from": "gpt", "value": "Seven."},
            {"from": "human", "value": "x " * 200},  # too long for the range: the session stops at turn 1
            {"from": "gpt", "value": "Yes."},
        ]
    },
]


def test_sharegpt_turns_are_smollm2_chat_template_prefixes(monkeypatch):
    meta = read_gguf_header(smollm2_gguf()).metadata
    template = jinja2.Environment().from_string(meta["tokenizer.chat_template"])
    tokenize = tokenize_function("SmolLM2-135M-Instruct")
    monkeypatch.setattr(prompts, "read_sharegpt", lambda: CONVERSATIONS)
    workload = parse_workload(
        {
            "name": "s",
            "dataset": {"kind": "sharegpt", "sessions": {"max_turns": 3}},
            "buckets": [
                {"name": "b", "input_tokens": [1, 64], "output_tokens": [1, 64], "concurrency": [1], "num_requests": 2}
            ],
        }
    )
    sampled = sample_buckets(workload, tokenize, 49152)
    assert sampled.dataset_info["num_conversations"] == 3
    by_source = {}
    for r in sampled.requests["b"]:
        by_source.setdefault(r.source, []).append(r)
    assert {s: [r.turn for r in rs] for s, rs in by_source.items()} == {"sharegpt:1": [1, 2, 3], "sharegpt:2": [1]}
    for source, turns in by_source.items():
        messages = CONVERSATIONS[int(source.split(":")[1])]["conversations"]
        history = []
        for k, request in enumerate(turns):
            human, reply = messages[2 * k]["value"], messages[2 * k + 1]["value"]
            history.append({"role": "user", "content": human})
            text = template.render(messages=history, add_generation_prompt=True)
            assert text.startswith(SYSTEM)  # the template's default system message
            # the rendered template, tokenised whole, is the prompt built from separately tokenised pieces
            assert list(request.prompt_token_ids) == tokenize([text])[0], (source, k)
            assert request.max_tokens == len(tokenize([reply])[0])
            history.append({"role": "assistant", "content": reply})


def test_the_simulators_sample_cache_keeps_sessions(monkeypatch, tmp_path):
    monkeypatch.setenv(samples.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(prompts, "read_sharegpt", lambda: CONVERSATIONS)
    data = {
        "name": "s",
        "dataset": {"kind": "sharegpt", "sessions": {"max_turns": 3, "think_time_s": [1, 5]}},
        "buckets": [
            {"name": "b", "input_tokens": [1, 64], "output_tokens": [1, 64], "concurrency": [1], "num_requests": 2}
        ],
    }
    workload = parse_workload(data)
    tokenize = tokenize_function("SmolLM2-135M-Instruct")
    first = samples.cached_sample(workload, lambda: tokenize, 49152, ["tok"])
    again = samples.cached_sample(workload, lambda: None, 49152, ["tok"])  # read back: no tokenizer needed
    assert again.requests == first.requests and any(r.turn == 3 and r.think_time_s >= 1 for r in again.requests["b"])
    other = parse_workload({**data, "dataset": {"kind": "sharegpt", "sessions": {"max_turns": 2}}})
    assert samples.sample_key(other, 49152, ["tok"]) != samples.sample_key(workload, 49152, ["tok"])


def test_users_wait_for_each_reply_and_think(measured, sampled):
    think = {(r.session, r.turn): r.think_time_s for r in sampled}
    for level in measured.result.levels:
        own = [r for r in measured.requests if r.key == level.key]
        assert len(own) == len(sampled) and all(r.cache_salt == level.key.id for r in own)
        steps = [s for s in measured.steps if s.key == level.key]
        for turns in sessions_of(own).values():
            for before, after in zip(turns, turns[1:]):
                # scheduled at the end of the step that finished the previous turn + the think time
                done = min(s.end_time for s in steps if s.end_time >= before.finish_time)
                assert after.arrival_time == done + think[after.session, after.turn]
        if level.mode == "closed":  # N users: never more than N turns in flight
            assert max(s.num_running + s.num_waiting for s in steps) <= level.level


def test_open_loop_sessions_start_at_the_levels_arrivals(measured):
    opened = [r for r in measured.requests if r.mode == "open" and r.turn == 1]
    firsts = np.array([r.arrival_time for r in sorted(opened, key=lambda r: r.session)])
    gaps = np.random.default_rng([0, 0, 50_000]).exponential(1 / 50, size=18)  # chunk: the level's 18 turns
    assert np.allclose(firsts - firsts[0], np.concatenate([[0.0], np.cumsum(gaps[:5])]), atol=1e-9)


def test_later_turns_hit_their_history_in_the_prefix_cache(tmp_path):
    data = load_workload(WORKLOAD).model_dump(mode="json")
    data["engine"]["num_blocks"] = 200  # room for every block: nothing cached is evicted
    run = load_run(run_loadtest(parse_workload(data), tmp_path / "run"))
    later = 0
    for level in run.result.levels:
        own = [r for r in run.requests if r.key == level.key]
        for turns in sessions_of(own).values():
            for before, after in zip(turns, turns[1:]):
                # the engine emitted the recorded reply (forced_token_ids), so the KV the previous turn
                # left holds its prompt and all but the last reply token (sampled, never computed): the
                # next prompt, which carries that reply, hits every full block of it
                history = before.num_prompt_tokens + before.num_output_tokens - 1
                assert after.num_cached_tokens == history // BLOCK * BLOCK
                assert after.num_cached_tokens >= before.num_prompt_tokens // BLOCK * BLOCK
                later += 1
        assert level.turns[0].prefix_hit_tokens == 0
    assert later == 2 * 6 * 2  # two levels x 6 sessions x turns 2 and 3


def test_the_per_turn_summary_is_what_the_records_say(measured):
    for level in measured.result.levels:
        own = [r for r in measured.requests if r.key == level.key]
        assert [t.turn for t in level.turns] == [1, 2, 3]
        for t in level.turns:
            turn = [r for r in own if r.turn == t.turn]
            ttfts = [(r.token_times[0] - r.arrival_time) * 1e3 for r in turn if r.finish_reason == "length"]
            assert (t.num_requests, t.num_completed) == (len(turn), len(ttfts))
            assert t.ttft_ms.p50 == pytest.approx(np.percentile(ttfts, 50))
            assert t.ttft_ms.p99 == pytest.approx(np.percentile(ttfts, 99))
            assert t.prefix_hit_tokens == sum(r.num_cached_tokens for r in turn)
            assert t.prompt_tokens == sum(r.num_prompt_tokens for r in turn)
    assert sum(t.prefix_hit_tokens for lv in measured.result.levels for t in lv.turns[1:]) > 0
    code, out, err = run_cli("report", str(measured.run_dir), "--json")
    assert (code, err) == (0, "")
    levels = json.loads(out)["buckets"][0]["levels"]
    for printed, level in zip(levels, measured.result.levels):
        assert [
            (t["turn"], t["num_completed"], t["prefix_hit_tokens"], t["ttft_ms"]["p99"]) for t in printed["turns"]
        ] == [(t.turn, t.num_completed, t.prefix_hit_tokens, t.ttft_ms.p99) for t in level.turns]
    summary = (measured.run_dir / "summary.md").read_text()
    assert "## Sessions: per turn" in summary and "| chat | c=4 | 3 | 6/6 |" in summary


def test_the_estimate_sizes_a_session_by_its_largest_turn(measured, sampled):
    largest = [max(r.num_tokens for r in turns) for turns in sessions_of(sampled).values()]
    assert measured.result.buckets[0].p95_request_tokens == math.ceil(np.percentile(largest, 95))
    assert measured.result.estimate.buckets[0].num_requests == len(sampled)  # every turn is a request


def test_the_simulator_replays_a_session_run_at_every_step(workload, measured, tmp_path):
    steps = measured.steps
    assert covers_preemption_and_hits(measured)  # a 12-block pool at c=4 (sessions_tiny.yaml); turns 2 and 3 hit
    run = load_run(simulate(workload, replay_setup(workload, measured.run_dir), tmp_path / "sim"))
    mine, theirs = by_level(run.steps), by_level(steps)
    assert list(mine) == list(theirs) and {k.mode for k in theirs} == {"closed", "open"}
    for key, level_steps in theirs.items():
        assert len(mine[key]) == len(level_steps), key
        for a, b in zip(mine[key], level_steps):
            for field in SAME:
                assert getattr(a, field) == getattr(b, field), (key, b.step_index, field)

    def shape(rs):
        return sorted((r.request_id, r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens, r.turn) for r in rs)

    assert shape(run.requests) == shape(measured.requests)
    assert [lv.turns for lv in run.result.levels] != [None] * len(run.result.levels)


BAD_SESSIONS = {
    "sessions_zero_turns.yaml": "dataset.sessions.max_turns: must be >= 1 (got 0)",
    "sessions_jsonl.yaml": "dataset.sessions: applies to dataset sharegpt and random only (dataset is jsonl)",
    "sessions_duration.yaml": "buckets[0].duration_s: is not supported with sessions (dataset.sessions)",
    "sessions_shared_prefix.yaml": "shared_prefix: is not supported with sessions (dataset.sessions)",
}


@pytest.mark.parametrize("name", sorted(BAD_SESSIONS))
def test_bad_sessions_exit_2_with_one_line(name, tmp_path):
    code, out, err = run_cli("loadtest", str(BAD / name), "--out", str(tmp_path / "run"), "--quiet")
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"error: {BAD / name}: {BAD_SESSIONS[name]}"), err
    assert not (tmp_path / "run").exists()
