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
    "hash_ids_bool": (
        '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [true]}',
        "t.jsonl: line 1: hash_ids: must be a list of integers >= 0",
    ),
    "hash_ids_negative": (
        '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [3, -1]}',
        "t.jsonl: line 1: hash_ids: must be a list of integers >= 0",
    ),
    "hash_ids_float": (
        '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [1.0]}',
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
    "device": ({"path": "/dev/zero"}, {}, "dataset.path: is not a regular file (a device, pipe or socket): /dev/zero"),
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


# CSV traces (the Azure LLM inference traces, BurstGPT): told by their header, rows without hash ids

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,174,44\n"  # seven fractional digits, as the 2023 traces give
    "2023-11-16 18:15:47.1805900,96,9\n"  # + 0.5 s
    "2023-11-16 18:15:48.6805901,120,3\n"  # + 2.0000001 s
)
# a later release's column order and extra columns; the 0-response row is a failed request
BURSTGPT = (
    "Timestamp,Model,Session ID,Request tokens,Response tokens,Total tokens,Log Type,Elapsed time\n"
    "5,ChatGPT,,80,20,100,Conversation log,1.5\n"
    "6,GPT-4,,50,0,50,Conversation log,0.1\n"
    "9,ChatGPT,s1,30,7,37,API log,2\n"
)


def write_csv_workload(folder: Path, text: str, dataset: dict | None = None) -> Path:
    (folder / "t.csv").write_text(text)
    dataset = {"kind": "trace", "path": "t.csv", "speed": 2.0, **(dataset or {})}
    # block 4: the shipped calibration of tiny-random-llama the simulator steps by
    engine = {"model": "tiny-random-llama", "dtype": "float32", "block_size": 4, "num_blocks": 1024}
    doc = {"name": "csv", "engine": engine, "dataset": dataset, "buckets": [{"name": "trace"}]}
    path = folder / "trace.yaml"
    path.write_text(json.dumps(doc))
    return path


def test_an_azure_csv_trace_replays_its_rows_from_the_first_time_over_speed(tmp_path):
    from kvplan.traffic.prompts import sample_buckets
    from kvplan.workload.trace import read_trace

    workload = load_workload(write_csv_workload(tmp_path, AZURE))
    trace = read_trace(workload)
    assert [r.line for r in trace.requests] == [2, 3, 4]
    # offsets 0, 0.5 and 2.0000001 s from the first row, halved by speed 2; every fractional digit kept
    assert [r.offset_s for r in trace.requests] == pytest.approx([0.0, 0.25, 1.00000005], abs=1e-9)
    assert [(r.input_length, r.output_length, r.hash_ids) for r in trace.requests] == [
        (174, 44, None),
        (96, 9, None),
        (120, 3, None),
    ]
    assert workload.buckets[0].num_requests == 3 and trace.mean_rate == pytest.approx(2 / 1.00000005)
    requests = sample_buckets(workload, None, 512).requests["trace"]
    assert [(r.num_prompt_tokens, r.max_tokens) for r in requests] == [(174, 44), (96, 9), (120, 3)]
    first, second = (r.prompt_token_ids for r in requests[:2])
    assert first[:16] != second[:16]  # no hash ids: blocks of its own, shared with nothing


def test_a_burstgpt_trace_leaves_out_failed_rows_and_takes_max_requests_of_the_rest(tmp_path):
    from kvplan.workload.trace import read_trace

    trace = read_trace(load_workload(write_csv_workload(tmp_path, BURSTGPT)))
    assert [(r.line, r.offset_s, r.input_length, r.output_length) for r in trace.requests] == [
        (2, 0.0, 80, 20),
        (4, 2.0, 30, 7),  # (9 - 5) s / speed 2; line 3 (0 response tokens) is not a request
    ]
    capped = read_trace(
        load_workload(write_csv_workload(tmp_path, BURSTGPT + "12,ChatGPT,,9,9,18,API log,1\n", {"max_requests": 2}))
    )
    assert [r.line for r in capped.requests] == [2, 4]


def test_a_csv_trace_simulates_its_rows_at_their_times(tmp_path):
    from kvplan.run.sim.setups import engine_setup

    workload = load_workload(write_csv_workload(tmp_path, AZURE))
    run = load_run(simulate(workload, engine_setup(workload)[0], tmp_path / "sim", search=False))
    (level,) = run.result.levels
    assert (level.key.mode, level.num_completed) == ("open", 3)
    records = by_index(run)
    assert [r.arrival_time - records[0].arrival_time for r in records] == pytest.approx([0, 0.25, 1.00000005], abs=1e-6)
    assert [r.num_prompt_tokens for r in records] == [174, 96, 120]


CSV_BAD = {
    "unknown_header": (
        "time,in,out\n1,2,3\n",
        "t.csv: line 1: header: names no trace format kvplan knows (time, in, out); give a Mooncake JSONL trace"
        " or a CSV whose header holds one format's columns: azure: TIMESTAMP, ContextTokens, GeneratedTokens;"
        " burstgpt: Timestamp, Request tokens, Response tokens",
    ),
    "bad_time": (AZURE + "yesterday,4,2\n", "t.csv: line 5: TIMESTAMP: is not a number of s or an ISO 8601 time"),
    "bad_length": (AZURE.replace(",96,", ",many,"), "t.csv: line 3: ContextTokens: must be a whole number of tokens"),
    "zero_prompt": (AZURE.replace(",96,", ",0,"), "t.csv: line 3: ContextTokens: must be >= 1 token (got 0)"),
    "fields": (AZURE + "2023-11-16 18:15:49,4\n", "t.csv: line 5: 2 fields where the header has 3"),
    "out_of_order": (
        AZURE + "2023-11-16 18:15:40,4,2\n",
        "t.csv: line 5: TIMESTAMP: 2023-11-16 18:15:40 is before line 4's; sort the trace by time",
    ),
    "no_rows": (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n",
        "t.csv: the trace has no requests (no rows after the header)",
    ),
}


@pytest.mark.parametrize("name", sorted(CSV_BAD))
def test_a_bad_csv_trace_is_one_line_naming_the_line_and_column(name, tmp_path):
    text, expected = CSV_BAD[name]
    with pytest.raises(KvplanError) as caught:
        load_workload(write_csv_workload(tmp_path, text))
    assert expected in str(caught.value) and "\n" not in str(caught.value)
