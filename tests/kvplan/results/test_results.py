"""The run folder on disk: records appended and flushed as they happen, the run result replaced whole."""

import json

import pandas as pd
import pytest

from kvplan.errors import KvplanError
from kvplan.results.csv_tables import write_tables
from kvplan.results.metrics import Slo
from kvplan.results.records import RequestRecord, StepRecord
from kvplan.results.run_result import (
    SCHEMA_VERSION,
    BucketEstimate,
    RunEstimate,
    RunInfo,
    RunResult,
    WorkloadRef,
    load_run,
    save_result,
)
from kvplan.results.store import write_atomic
from kvplan.results.summarize import summarize
from kvplan.results.writing.run_writer import RunWriter


def result(**fields):
    """A run result holding only what a test needs (a run just started)."""
    base = dict(
        started_at="2026-11-30T10:00:00+00:00",
        workload=WorkloadRef(name="t"),
        run=RunInfo(kvplan_version="0", python="3.11", platform="test"),
    )
    return RunResult(**{**base, **fields})


def estimate(*buckets):
    return RunEstimate(
        model="m",
        kv_cache_dtype="bf16",
        bytes_per_token=256,
        bytes_per_block=1024,
        block_size=4,
        num_blocks=10,
        pool_tokens=40,
        pool_bytes=10240,
        buckets=list(buckets),
    )


def write_results(run_dir, data):
    """results.json as written by hand (a dict), for files kvplan itself would not write."""
    (run_dir / "results.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, **data}))


def request(rid="b/closed/2/0", level=2.0, tokens=(1.25, 1.5, 2.0), reason="length"):
    return RequestRecord(
        rid,
        "b",
        "closed",
        level,
        1.0,
        1.0,
        tokens[-1] if tokens else 1.1,
        tuple(tokens),
        12,
        len(tokens),
        3,
        reason,
        "",
        0,
        0,
    )


def step(i, used=3, level=2.0, preemptions=0, measured=3072, paged=3072):
    return StepRecord(
        i,
        "b",
        "closed",
        level,
        float(i),
        i + 0.5,
        4,
        1,
        2,
        0,
        used,
        5,
        8,
        preemptions,
        0,
        0,
        0,
        0,
        (9, 3),
        6000,
        paged,
        9000,
        measured,
    )


def test_records_are_on_disk_before_the_writer_closes(tmp_path):
    writer = RunWriter(tmp_path)
    writer.write_request(request())
    writer.write_step(step(0))
    # Read while still open: each line was flushed when written.
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["token_times"] == [1.25, 1.5, 2.0]
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 1
    writer.close()


def test_load_run_round_trips_and_drops_a_torn_last_line(tmp_path):
    save_result(tmp_path, result())
    with RunWriter(tmp_path) as writer:
        writer.write_request(request())
        writer.write_step(step(0))
        writer.write_step(step(1))
    with open(tmp_path / "steps.jsonl", "a") as handle:
        handle.write('{"step_index": 2, "bucket": "b", "mo')  # killed mid-write
    data = load_run(tmp_path)
    assert data.result == result() and data.result.schema_version == SCHEMA_VERSION == 2
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "running"
    assert data.requests == [request()]
    assert [s.step_index for s in data.steps] == [0, 1]
    assert data.steps[0].kv_resident_tokens == (9, 3)


def test_a_torn_line_in_the_middle_is_an_error(tmp_path):
    save_result(tmp_path, result(status="complete"))
    (tmp_path / "requests.jsonl").write_text('{"broken\n' + json.dumps(request().__dict__) + "\n")
    with pytest.raises(KvplanError, match=r"requests.jsonl: line 1: not valid JSON"):
        load_run(tmp_path)


def test_write_atomic_replaces_whole_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    write_atomic(target, "new contents")
    assert target.read_text() == "new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_load_run_refuses_missing_or_foreign_results(tmp_path):
    with pytest.raises(KvplanError, match="no results.json here"):
        load_run(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(KvplanError, match=r"results.json: schema_version: expected 1 or 2 \(got 99\)"):
        load_run(tmp_path)


def test_csv_tables_hold_derived_latencies_in_ms(tmp_path):
    write_tables(tmp_path, [request(), request("b/closed/2/1", tokens=(), reason="cannot_fit")], [step(0)])
    requests = pd.read_csv(tmp_path / "requests.csv")
    # arrival 1.0 s, tokens at 1.25, 1.5, 2.0 s: TTFT 250 ms, E2E 1000 ms, TPOT 750 / 2 = 375 ms.
    first = requests.iloc[0]
    assert (first.ttft_ms, first.e2e_ms, first.tpot_ms) == pytest.approx((250.0, 1000.0, 375.0))
    assert pd.isna(requests.iloc[1].ttft_ms) and pd.isna(requests.iloc[1].tpot_ms)
    steps = pd.read_csv(tmp_path / "steps.csv")
    assert (steps.iloc[0].num_kv_requests, steps.iloc[0].kv_resident_tokens) == (2, 12)
    assert steps.iloc[0].kv_cache_usage == pytest.approx(3 / 8)
    write_tables(tmp_path, [], [])  # an empty run still writes headers
    assert "ttft_ms" not in pd.read_csv(tmp_path / "requests.csv").columns
    assert "request_id" in pd.read_csv(tmp_path / "requests.csv").columns


def test_summarize_pairs_each_bucket_estimate_with_its_knee():
    before = result(
        slo=Slo(ttft_ms=300.0),
        estimate=estimate(
            BucketEstimate(name="b", num_requests=1, p95_request_tokens=40, blocks_per_request=10, max_concurrency=3)
        ),
    )
    steps = [step(0, level=2.0), step(1, level=4.0, preemptions=2, measured=4096)]
    reqs = [request(), request("b/closed/4/0", level=4.0)]
    out = summarize(before, reqs, steps)
    assert not before.summarized and out.summarized
    assert [b.model_dump() for b in out.buckets] == [
        {
            "name": "b",
            "p95_request_tokens": 40,
            "predicted_max_concurrency": 3,
            "simulated_knee": None,
            "measured_knee": 4,
            "max_clean_concurrency": 2,
            "levels_run": [2.0, 4.0],
        }
    ]
    assert out.kv.model_dump() == {
        "num_steps": 2,
        "max_paged_error_bytes": 1024,
        "num_requests": 2,
        "num_shared_steps": None,
    }
    # TTFT 250 ms meets the 300 ms SLO: goodput = requests/s = 1 request / 1.0 s span.
    assert out.levels[0].goodput_rps == pytest.approx(1.0)


def test_summary_files_get_the_umask_mode_like_the_jsonl(tmp_path):
    import os

    for umask, mode in ((0o022, 0o644), (0o002, 0o664)):
        old = os.umask(umask)
        try:
            save_result(tmp_path, result())
            write_tables(tmp_path, [request()], [step(0)])
            write_atomic(tmp_path / "summary.md", "# t\n")
            with RunWriter(tmp_path):
                pass
        finally:
            os.umask(old)
        for name in ("results.json", "requests.csv", "steps.csv", "summary.md", "requests.jsonl"):
            assert (tmp_path / name).stat().st_mode & 0o777 == mode, name
        (tmp_path / "requests.jsonl").unlink()
        (tmp_path / "steps.jsonl").unlink()


@pytest.mark.parametrize(
    "line, message",
    [
        ("null", "steps.jsonl: line 2: must be a JSON object (a record)"),
        ("[]", "steps.jsonl: line 2: must be a JSON object (a record)"),
        ('{"step_index": 1}', "steps.jsonl: line 2: bucket: required field missing [+21 more]"),
    ],
)
def test_a_record_that_is_not_a_step_is_one_line_naming_file_and_line(tmp_path, line, message):
    save_result(tmp_path, result())
    with RunWriter(tmp_path) as writer:
        writer.write_step(step(0))
    with open(tmp_path / "steps.jsonl", "a") as handle:
        handle.write(line + "\n")
    with open(tmp_path / "steps.jsonl", "a") as handle:  # a good last line: line 2 is no torn tail
        handle.write(json.dumps(step(2).__dict__) + "\n")
    with pytest.raises(KvplanError) as caught:
        load_run(tmp_path)
    assert str(caught.value) == f"{tmp_path}/{message}"


def test_a_field_of_the_wrong_type_is_named(tmp_path):
    save_result(tmp_path, result())
    row = {**json.loads(json.dumps(step(0).__dict__)), "num_used_blocks": "abc"}
    (tmp_path / "steps.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(step(1).__dict__) + "\n")
    with pytest.raises(KvplanError) as caught:
        load_run(tmp_path)
    assert str(caught.value) == f"{tmp_path}/steps.jsonl: line 1: num_used_blocks: must be an integer (got 'abc')"


HEAD = {
    "started_at": "2026-11-30T10:00:00+00:00",
    "workload": {"name": "t"},
    "run": {"kvplan_version": "0", "python": "3.11", "platform": "test"},
}


@pytest.mark.parametrize(
    "results, message",
    [
        ({"workload": "x"}, "workload: must be a mapping (got 'x')"),
        ({"slo": {"ttft_ms": "fast"}}, "slo.ttft_ms: must be a number (got 'fast')"),
        ({"levels": [{"bucket": "b"}]}, "levels[0].mode: required field missing [+"),
        ({"kv": []}, "kv: must be a mapping"),
        ({"status": "paused"}, "status: must be one of 'running', 'complete', 'interrupted' (got 'paused')"),
    ],
)
def test_results_sections_of_the_wrong_shape_are_one_line(tmp_path, results, message):
    write_results(tmp_path, {**HEAD, "status": "complete", **results})
    with pytest.raises(KvplanError) as caught:
        load_run(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path}/results.json: {message}")


def test_results_json_that_is_not_an_object_is_one_line(tmp_path):
    (tmp_path / "results.json").write_text("[]")
    with pytest.raises(KvplanError, match=r"results.json: must hold a JSON object \(got list\)"):
        load_run(tmp_path)


def test_a_level_cut_short_counts_against_the_buckets_planned_requests():
    from kvplan.results.report import tables

    # A killed open-loop run: 1 of the bucket's 8 requests at 200 req/s finished.
    planned = result(
        estimate=estimate(
            BucketEstimate(name="b", num_requests=8, p95_request_tokens=15, blocks_per_request=4, max_concurrency=2)
        )
    )
    done = RequestRecord(**{**request().__dict__, "mode": "open", "level": 200.0})
    out = summarize(planned, [done], [StepRecord(**{**step(0).__dict__, "mode": "open", "level": 200.0})])
    (level,) = out.levels
    assert (level.num_requests, level.num_planned, level.partial) == (1, 8, True)
    row = tables.console_table(out).iloc[0]
    assert (row["level"], row["done"]) == ("200 req/s partial", "1/8")
