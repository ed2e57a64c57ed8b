"""Trace replay (``dataset: {kind: trace}``, kvplan.traffic.trace): a Mooncake-format trace written here,
replayed on the bundled tiny engine and in the simulator on its replayed clock. Each request's
prefix-cache hit is the count its hash ids imply, arrivals are the timestamps over ``speed``, and
bad traces are one line each."""

import json
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.results.run_result import load_run
from kvplan.run.loadtest import run_loadtest
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import replay_setup
from kvplan.workload.file import load_workload
from tests.kvplan.cli_runner import run_cli

BLOCK, ENGINE_BLOCK, SPEED = 32, 16, 4.0
# (timestamp ms, input_length, output_length, hash_ids): 500 ms (125 ms after speed) or more between
# arrivals, so every earlier request has finished when the next is scheduled (the tiny model takes
# milliseconds); block_tokens 32 so that prompts under the tiny model's 256 positions span several blocks
LINES = [
    (0, 100, 4, [0, 1, 2, 3]),  # 4 blocks, the last 4 tokens
    (1000, 128, 4, [0, 1, 2, 5]),  # 3 leading blocks seen: 96 tokens
    (2000, 64, 3, [0, 1]),  # all seen: capped below the prompt, 48
    (3000, 200, 4, [7, 8, 9, 10, 11, 12, 13]),  # none seen
    (3500, 150, 2, [7, 8, 9, 10, 14]),  # 4 seen: 128
    (4000, 40, 4, [0, 1]),  # seen, the second block partial: 40 tokens in common, 32 in full blocks
    (5000, 90, 4, None),  # no hash ids: blocks of its own
    (6000, 20, 4, [30]),  # a partial block, 20 tokens
    (7000, 60, 4, [30, 31]),  # block 30 seen only as 20 tokens: 16 in full engine blocks
]


def write_trace(path: Path, lines=LINES) -> Path:
    rows = []
    for stamp, inputs, outputs, ids in lines:
        row = {"timestamp": stamp, "input_length": inputs, "output_length": outputs}
        rows.append(json.dumps(row if ids is None else {**row, "hash_ids": ids}))
    path.write_text("\n".join(rows) + "\n")
    return path


def write_workload(folder: Path, dataset: dict | None = None, bucket: dict | None = None, trace: str = "t.jsonl"):
    dataset = {"kind": "trace", "path": trace, "speed": SPEED, "block_tokens": BLOCK, **(dataset or {})}
    engine = {"model": "tiny-random-llama", "dtype": "float32", "block_size": ENGINE_BLOCK, "num_blocks": 256}
    doc = {"name": "trace", "engine": engine, "dataset": dataset, "buckets": [{"name": "trace", **(bucket or {})}]}
    path = folder / "trace.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def implied_hits(lines=LINES, block=BLOCK, engine_block=ENGINE_BLOCK) -> list[int]:
    """Per request, from the hash ids alone: the longest prompt prefix it shares with an earlier
    request (leading equal ids x block, within both prompts), in full engine blocks, below its own
    prompt length (the engine computes the last prompt token)."""
    hits = []
    for j, (_, length, _, ids) in enumerate(lines):
        common = 0
        for _, earlier, _, theirs in lines[:j]:
            if ids is None or theirs is None:
                continue
            k = 0
            while k < min(len(ids), len(theirs)) and ids[k] == theirs[k]:
                k += 1
            common = max(common, min(k * block, earlier, length))
        hits.append(min(common // engine_block, (length - 1) // engine_block) * engine_block)
    return hits


def test_the_implied_hits_are_what_the_comments_say():
    assert implied_hits() == [0, 96, 48, 0, 128, 32, 0, 0, 16]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trace")
    write_trace(folder / "t.jsonl")
    workload = load_workload(write_workload(folder))
    measured = load_run(run_loadtest(workload, folder / "measured"))
    simulated = load_run(simulate(workload, replay_setup(workload, measured.run_dir), folder / "sim", search=False))
    return workload, measured, simulated


def by_index(run) -> list:
    return sorted(run.requests, key=lambda r: int(r.request_id.rsplit("/", 1)[1]))


def test_a_trace_bucket_is_one_open_level_at_the_trace_rate(runs):
    workload, measured, simulated = runs
    assert workload.buckets[0].num_requests == len(LINES)
    rate = (len(LINES) - 1) / (LINES[-1][0] / 1000 / SPEED)  # 8 gaps over 1.75 s
    for run in (measured, simulated):
        (level,) = run.result.levels
        assert (level.key.mode, level.key.value, level.num_completed) == ("open", pytest.approx(rate), len(LINES))


def test_requests_arrive_at_the_timestamps_over_speed(runs):
    _, measured, simulated = runs
    for run in (measured, simulated):
        records = by_index(run)
        start = records[0].arrival_time
        offsets = [r.arrival_time - start for r in records]
        assert offsets == pytest.approx([stamp / 1000 / SPEED for stamp, *_ in LINES], abs=1e-6)
        assert [r.num_prompt_tokens for r in records] == [n for _, n, _, _ in LINES]
        assert [r.max_tokens for r in records] == [m for _, _, m, _ in LINES]


def test_prefix_hits_are_what_the_hash_ids_imply_in_the_engine_and_the_simulator(runs):
    _, measured, simulated = runs
    expected = implied_hits()
    assert [r.num_cached_tokens for r in by_index(measured)] == expected
    assert [r.num_cached_tokens for r in by_index(simulated)] == expected


def test_clipping_keeps_the_leading_blocks_and_max_requests_the_first_lines(tmp_path):
    write_trace(tmp_path / "t.jsonl")
    workload = load_workload(
        write_workload(tmp_path, {"max_requests": 5, "max_input_tokens": 70, "max_output_tokens": 3})
    )
    from kvplan.traffic.prompts import sample_buckets

    requests = sample_buckets(workload, None, 512).requests["trace"]
    assert [r.num_prompt_tokens for r in requests] == [70, 70, 64, 70, 70]
    assert [r.max_tokens for r in requests] == [3, 3, 3, 3, 2]
    assert requests[0].prompt_token_ids[:64] == requests[1].prompt_token_ids[:64] == requests[2].prompt_token_ids
    unclipped = sample_buckets(load_workload(write_workload(tmp_path)), None, 512).requests["trace"]
    assert requests[3].prompt_token_ids == unclipped[3].prompt_token_ids[:70]
    assert workload.buckets[0].num_requests == 5


BAD = {
    "not_json": ("{nope", "t.jsonl: line 1: not valid JSON"),
    "no_timestamp": ('{"input_length": 4, "output_length": 2}', "t.jsonl: line 1: timestamp: required field missing"),
    "no_input": ('{"timestamp": 0, "output_length": 2}', "t.jsonl: line 1: input_length: required field missing"),
    "no_output": ('{"timestamp": 0, "input_length": 4}', "t.jsonl: line 1: output_length: required field missing"),
    "negative_length": (
        '{"timestamp": 0, "input_length": -4, "output_length": 2}',
        "t.jsonl: line 1: input_length: must be an integer >= 1, tokens (got -4)",
    ),
    "float_length": (
        '{"timestamp": 0, "input_length": 4, "output_length": 2.5}',
        "t.jsonl: line 1: output_length: must be an integer >= 1, tokens (got 2.5)",
    ),
    "hash_ids_not_ints": (
        '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": ["a"]}',
        "t.jsonl: line 1: hash_ids: must be a list of integers >= 0",
    ),
    "too_few_hash_ids": (
        '{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [1]}',
        "t.jsonl: line 1: hash_ids: 1 ids cover 32 tokens, input_length 40 needs 2 blocks of 32",
    ),
    "out_of_order": (
        '{"timestamp": 5, "input_length": 4, "output_length": 2}\n'
        '{"timestamp": 1, "input_length": 4, "output_length": 2}',
        "t.jsonl: line 2: timestamp: 1 ms is before line 1's",
    ),
    "empty": ("\n\n", "t.jsonl: the trace has no requests"),
    "one_instant": (
        '{"timestamp": 0, "input_length": 4, "output_length": 2}',
        "trace.yaml: dataset.path: all 1 requests of the trace arrive at once",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_trace_is_one_line_naming_the_line_and_field(name, tmp_path):
    text, expected = BAD[name]
    (tmp_path / "t.jsonl").write_text(text)
    with pytest.raises(KvplanError) as caught:
        load_workload(write_workload(tmp_path))
    assert expected in str(caught.value) and "\n" not in str(caught.value)


BAD_WORKLOADS = {
    "zero_speed": ({"speed": 0}, {}, "dataset.speed: must be > 0"),
    "missing_file": ({"path": "nope.jsonl"}, {}, "dataset.path: file not found"),
    "num_requests": ({}, {"num_requests": 4}, "buckets[0].num_requests: does not apply to a trace bucket"),
    "concurrency": ({}, {"concurrency": [2]}, "buckets[0].concurrency: does not apply to a trace bucket"),
    "request_rates": ({}, {"request_rates": [1.0]}, "buckets[0].request_rates: does not apply to a trace bucket"),
    "input_tokens": ({}, {"input_tokens": 8}, "buckets[0].input_tokens: does not apply to a trace bucket"),
    "speed_elsewhere": ({"kind": "random", "path": None}, {}, "dataset: speed applies to trace only"),
}


@pytest.mark.parametrize("name", sorted(BAD_WORKLOADS))
def test_loadtest_on_a_bad_trace_workload_exits_2_with_one_line(name, tmp_path):
    dataset, bucket, expected = BAD_WORKLOADS[name]
    write_trace(tmp_path / "t.jsonl")
    path = write_workload(tmp_path, dataset, bucket)
    if dataset.get("path", "") is None:  # drop the key altogether
        doc = json.loads(path.read_text())
        del doc["dataset"]["path"]
        path.write_text(json.dumps(doc))
    code, out, err = run_cli("loadtest", str(path), "--out", str(tmp_path / "run"), "--quiet")
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and expected in lines[0], err
    assert not (tmp_path / "run").exists()


def test_a_trace_replays_against_a_target_at_its_timestamps(tmp_path):
    from tests.kvplan.run.server.fake_server import FakeServer, Options

    write_trace(tmp_path / "t.jsonl")
    path = write_workload(tmp_path, {"max_requests": 4, "max_input_tokens": 60, "max_output_tokens": 2})
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "target": {"vocab_size": 512}}))
    server = FakeServer(Options(interval_s=0.002)).start()
    try:
        code, out, err = run_cli(
            "loadtest", str(path), "--target", server.url, "--out", str(tmp_path / "run"), "--quiet"
        )
    finally:
        server.stop()
    assert (code, err) == (0, ""), err
    data = load_run(tmp_path / "run")
    (level,) = data.result.levels
    assert (level.key.mode, level.key.value, level.num_completed) == ("open", pytest.approx(3 / (3.0 / SPEED)), 4)
    records = by_index(data)
    start = records[0].arrival_time
    assert [r.arrival_time - start for r in records] == pytest.approx([s / 1000 / SPEED for s, *_ in LINES[:4]])
    assert [r.max_tokens for r in records] == [2, 2, 2, 2]


def test_the_simulators_sample_cache_key_covers_the_trace_file(tmp_path):
    from kvplan.traffic.samples import sample_key

    write_trace(tmp_path / "t.jsonl")
    first = sample_key(load_workload(write_workload(tmp_path)), 512, [])
    assert sample_key(load_workload(write_workload(tmp_path)), 512, []) == first
    write_trace(tmp_path / "t.jsonl", [*LINES[:-1], (7000, 61, 4, [30, 31])])
    assert sample_key(load_workload(write_workload(tmp_path)), 512, []) != first
    assert sample_key(load_workload(write_workload(tmp_path, {"speed": 2.0})), 512, []) != first
