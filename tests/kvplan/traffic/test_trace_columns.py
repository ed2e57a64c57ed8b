"""A trace replayed through ``dataset.columns`` (kvplan.workload.trace_formats.columns): a CSV or JSONL
of no known format read by a column mapping gives the requests the same trace gives in a known format
(count, lengths, arrival offsets worked by hand), and a bad mapping is one line, exit 2."""

import json
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.workload.file import load_workload
from kvplan.workload.trace import read_trace
from tests.kvplan.cli_runner import run_cli

ENGINE = {"model": "tiny-random-llama", "dtype": "float32", "block_size": 4, "num_blocks": 1024}
# (ms from the start, prompt tokens, output tokens)
ROWS = [(0, 174, 44), (250, 96, 9), (1250, 120, 3), (4000, 33, 1)]
SPEED = 2.0
HAND_OFFSETS = [0.0, 0.125, 0.625, 2.0]  # ms / 1000 / speed 2
ODD = {"timestamp": "t (ms)", "input_tokens": "prompt len", "output_tokens": "gen", "session": "user"}


def write(folder: Path, name: str, text: str, dataset: dict | None = None) -> Path:
    (folder / name).write_text(text)
    doc = {
        "name": "cols",
        "engine": ENGINE,
        "dataset": {"kind": "trace", "path": name, "speed": SPEED, **(dataset or {})},
        "buckets": [{"name": "trace"}],
    }
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(doc))
    return path


def odd_csv(rows=ROWS) -> str:
    """The rows under odd column names, in another order, with an unmapped column and a session."""
    head = 'gen,"prompt len",ignored,t (ms),user\n'
    return head + "".join(f"{o},{i},x,{t},u{k % 2}\n" for k, (t, i, o) in enumerate(rows))


def mooncake(rows=ROWS) -> str:
    return "".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o}) + "\n" for t, i, o in rows)


def shape(path: Path):
    workload = load_workload(path)
    trace = read_trace(workload)
    return workload.buckets[0].num_requests, [(r.offset_s, r.input_length, r.output_length) for r in trace.requests]


def test_a_mapped_csv_replays_as_the_same_trace_in_mooncake_format(tmp_path):
    mapped = shape(write(tmp_path, "odd.csv", odd_csv(), {"columns": ODD, "time_unit": "ms"}))
    known = shape(write(tmp_path, "t.jsonl", mooncake()))
    assert mapped == known
    count, requests = mapped
    assert count == 4
    assert [r[0] for r in requests] == HAND_OFFSETS
    assert [r[1:] for r in requests] == [(i, o) for _, i, o in ROWS]


def test_a_mapped_csv_of_iso_times_replays_as_the_azure_trace(tmp_path):
    azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{46 + t // 1000:02d}.{t % 1000:03d}5900,{i},{o}\n" for t, i, o in ROWS
    )
    odd = "when;prompt;out\n".replace(";", ",") + "".join(
        f"2023-11-16T18:15:{46 + t // 1000:02d}.{t % 1000:03d}59,{i},{o}\n" for t, i, o in ROWS
    )
    columns = {"timestamp": "when", "input_tokens": "prompt", "output_tokens": "out"}
    mapped = read_trace(load_workload(write(tmp_path, "odd.csv", odd, {"columns": columns})))
    known = read_trace(load_workload(write(tmp_path, "azure.csv", azure)))
    assert [(r.line, r.input_length, r.output_length) for r in mapped.requests] == [
        (r.line, r.input_length, r.output_length) for r in known.requests
    ]
    # the same times (.xxx59 s against .xxx5900 s): offsets ms / 1000 / 2, the fraction kept exactly
    assert [r.offset_s for r in mapped.requests] == pytest.approx(HAND_OFFSETS, abs=1e-12)
    assert [r.offset_s for r in mapped.requests] == [r.offset_s for r in known.requests]


def test_a_mapped_jsonl_reads_its_keys_in_the_unit_given(tmp_path):
    text = "".join(
        json.dumps({"at_us": 7_000_000 + t * 1000, "in": str(i), "out": float(o), "extra": [1]}) + "\n"
        for t, i, o in ROWS
    )
    columns = {"timestamp": "at_us", "input_tokens": "in", "output_tokens": "out"}
    count, requests = shape(write(tmp_path, "odd.jsonl", text, {"columns": columns, "time_unit": "us"}))
    assert count == 4 and requests == [(h, i, o) for h, (_, i, o) in zip(HAND_OFFSETS, ROWS, strict=True)]


def test_max_requests_takes_the_first_mapped_rows(tmp_path):
    count, requests = shape(
        write(tmp_path, "odd.csv", odd_csv(), {"columns": ODD, "time_unit": "ms", "max_requests": 2})
    )
    assert count == 2 and [r[1] for r in requests] == [174, 96]


BAD = {
    "unknown_field": ({"columns": {**ODD, "prompt": "x"}}, "dataset.columns: unknown field 'prompt'; the fields are"),
    "missing": (
        {"columns": {"timestamp": "t (ms)", "input_tokens": "prompt len"}},
        "dataset.columns: missing output_tokens",
    ),
    "not_in_header": (
        {"columns": {**ODD, "output_tokens": "generated"}},
        "odd.csv: line 1: header: has no column 'generated', which dataset.columns maps output_tokens to",
    ),
    "empty_column": ({"columns": {**ODD, "session": " "}}, "dataset.columns.session: names no column"),
    "bad_unit": ({"columns": ODD, "time_unit": "min"}, "dataset.time_unit"),
    "unit_without_columns": ({"time_unit": "ms"}, "dataset: time_unit applies to a trace read through columns only"),
    "bad_cell": ({"columns": {**ODD, "output_tokens": "ignored"}}, "odd.csv: line 2: ignored: must be a whole number"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_mapping_is_one_line_exit_2(name, tmp_path):
    dataset, expected = BAD[name]
    path = write(tmp_path, "odd.csv", odd_csv(), dataset)
    with pytest.raises(KvplanError) as caught:
        load_workload(path)
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "run"))
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and expected in lines[0], err


def test_columns_apply_to_a_trace_only(tmp_path):
    doc = {"name": "x", "engine": ENGINE, "dataset": {"kind": "random", "columns": ODD}, "buckets": []}
    (tmp_path / "w.yaml").write_text(json.dumps(doc))
    with pytest.raises(KvplanError, match="columns applies to trace only"):
        load_workload(tmp_path / "w.yaml")
