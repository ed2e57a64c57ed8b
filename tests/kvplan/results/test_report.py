"""Reports rebuilt from a saved run: summary.md, CSVs and PNGs, including runs with nothing in them."""

import json

import pytest
from matplotlib.figure import Figure

from kvplan.errors import KvplanError
from kvplan.results.metrics import Slo
from kvplan.results.records import RequestRecord, StepRecord
from kvplan.results.report import plots, tables
from kvplan.results.report.render import render_report
from kvplan.results.run_result import (
    BucketEstimate,
    EngineFacts,
    RunEstimate,
    RunInfo,
    RunResult,
    WorkloadRef,
    load_run,
    save_result,
)
from kvplan.results.summarize import summarize
from kvplan.results.writing.run_writer import RunWriter

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHARTS = ["kv_over_time.png", "latency_b.png", "throughput_goodput.png", "kv_estimate_vs_measured.png"]


def request(rid, level, arrival, tokens):
    return RequestRecord(
        rid,
        "b",
        "closed",
        level,
        arrival,
        arrival,
        tokens[-1],
        tuple(tokens),
        8,
        len(tokens),
        len(tokens),
        "length",
        "",
        0,
        0,
    )


def step(i, level, used, preemptions=0, bytes_per_block=1024):
    return StepRecord(
        i,
        "b",
        "closed",
        level,
        i * 0.1,
        i * 0.1 + 0.05,
        0,
        1,
        1,
        0,
        used,
        10 - used,
        10,
        preemptions,
        0,
        0,
        0,
        0,
        (used * 4,),
        used * 4 * 256,
        used * bytes_per_block,
        256 * 256,
        used * bytes_per_block,
    )


def results_head(**fields):
    """A run result as saved before the first step: 10 blocks of 4 tokens, 1024 bytes each."""
    return RunResult(
        **{
            "status": "running",
            "started_at": "2026-11-29T10:00:00+00:00",
            "slo": Slo(ttft_ms=150.0),
            "workload": WorkloadRef(name="t", source="t.yaml", sha256="ab" * 32),
            "run": RunInfo(kvplan_version="0", python="3.11", platform="test"),
            "engine": EngineFacts(
                model="tiny",
                device="cpu",
                dtype="float32",
                kv_cache_dtype="fp32",
                attention_backend="torch",
                block_size=4,
                num_blocks=10,
                bytes_per_block=1024,
                max_model_len=40,
                max_num_seqs=8,
                max_num_batched_tokens=64,
                enable_prefix_caching=False,
                seed=0,
            ),
            "estimate": RunEstimate(
                model="tiny",
                kv_cache_dtype="fp32",
                bytes_per_token=256,
                bytes_per_block=1024,
                block_size=4,
                num_blocks=10,
                pool_tokens=40,
                pool_bytes=10240,
                buckets=[
                    BucketEstimate(
                        name="b",
                        num_requests=2,
                        p95_request_tokens=14,
                        blocks_per_request=4,
                        max_concurrency=2,
                        simulated_knee=3,
                    )
                ],
            ),
            **fields,
        }
    )


def write_run(run_dir):
    """Two closed-loop levels: c=1 with no preemption, c=4 with two."""
    save_result(run_dir, results_head())
    with RunWriter(run_dir) as writer:
        writer.write_request(request("a", 1.0, 0.0, [0.1, 0.2, 0.3]))
        writer.write_request(request("b", 1.0, 0.3, [0.5, 0.6]))
        for i, used in enumerate([3, 4, 3]):
            writer.write_step(step(i, 1.0, used))
        writer.write_request(request("c", 4.0, 1.0, [1.1, 1.3]))
        for i, (used, pre) in enumerate([(8, 0), (10, 2), (6, 0)], start=3):
            writer.write_step(step(i, 4.0, used, pre))


def test_report_rebuilds_summaries_of_an_unfinished_run(tmp_path):
    write_run(tmp_path)
    render_report(tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    # The run never wrote summaries; the report computed them from the records and saved them.
    assert [b["measured_knee"] for b in results["buckets"]] == [4]
    assert results["buckets"][0]["predicted_max_concurrency"] == 2
    assert results["kv"] == {"num_steps": 6, "max_paged_error_bytes": 0, "num_requests": 3, "num_shared_steps": None}
    for name in CHARTS + ["summary.md", "requests.csv", "steps.csv"]:
        assert (tmp_path / name).stat().st_size > 0, name
    for name in CHARTS:
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    summary = (tmp_path / "summary.md").read_text()
    assert "incomplete" in summary
    assert (
        "| b | 14 | 2 | 3 | 4 | 1 |" in summary
    )  # P95 tokens, predicted, simulated knee, measured knee, highest clean
    assert "TPOT = (E2E latency - TTFT) / (output tokens - 1)" in summary
    assert "Measured KV bytes equal the paged estimate at every one of 6 steps" in summary
    assert "![kv_over_time.png](kv_over_time.png)" in summary


def test_report_of_a_run_with_no_records_says_no_data(tmp_path):
    # Stopped before its first step finished: both record files exist, empty.
    save_result(tmp_path, results_head(status="interrupted"))
    RunWriter(tmp_path).close()
    render_report(tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert "interrupted" in summary and "No engine step was recorded." in summary
    for name in CHARTS:
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def texts(ax):
    return [t.get_text() for t in ax.texts]


def test_each_chart_says_no_data_instead_of_failing():
    fig = Figure()
    axes = [fig.add_subplot(2, 3, i + 1) for i in range(6)]
    plots.plot_kv_over_time(axes[0], [], 1024)
    plots.plot_latency_vs_level(axes[1], [], "ttft_ms")
    plots.plot_throughput(axes[2], [])
    plots.plot_goodput(axes[3], [])
    plots.plot_estimate_vs_measured(axes[4], [])
    plots.plot_peak_kv_per_level(axes[5], [])
    for ax in axes:
        assert any(t.startswith("no data: ") for t in texts(ax))


def test_kv_chart_draws_measured_paged_and_the_pool(tmp_path):
    write_run(tmp_path)
    data = load_run(tmp_path)
    fig = Figure()
    ax = fig.add_subplot()
    plots.plot_kv_over_time(ax, data.steps, 10240)
    labels = [line.get_label() for line in ax.get_lines()]
    assert "KV pool size" in labels and "measured (used blocks x bytes/block)" in labels
    measured = next(line for line in ax.get_lines() if line.get_label().startswith("measured"))
    assert list(measured.get_ydata()) == [used * 1024 / 2**20 for used in (3, 4, 3, 8, 10, 6)]


def test_markdown_table_leaves_undefined_values_empty():
    import pandas as pd

    frame = pd.DataFrame([{"a": "x", "b": None, "c": 1234.5, "d": 0.12345}])
    assert tables.to_markdown(frame) == "| a | b | c | d |\n|---|---|---|---|\n| x |  | 1,234.5 | 0.123 |\n"


def snapshot(run_dir):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run_dir.iterdir())}


def finished_run(run_dir):
    """A run as kvplan loadtest leaves it: records, summaries (kv counts 6 steps, 3 requests), views."""
    run_dir.mkdir()
    write_run(run_dir)
    render_report(run_dir)
    return run_dir


def test_report_refuses_missing_records_and_writes_nothing(tmp_path):
    from tests.kvplan.cli_runner import run_cli

    run_dir = finished_run(tmp_path / "run")
    (run_dir / "steps.jsonl").unlink()
    (run_dir / "requests.jsonl").unlink()
    before = snapshot(run_dir)
    code, out, err = run_cli("report", str(run_dir))
    assert (code, out) == (2, "")
    assert err == (
        f"error: {run_dir / 'steps.jsonl'}: missing; restore it from the run (kvplan report rebuilds"
        " every view from the records; nothing was written)\n"
    )
    assert snapshot(run_dir) == before  # the CSVs, PNGs and summary.md keep the measured run


def test_report_refuses_fewer_records_than_results_json_counts(tmp_path):
    from tests.kvplan.cli_runner import run_cli

    run_dir = finished_run(tmp_path / "run")
    (run_dir / "steps.jsonl").write_text("")
    before = snapshot(run_dir)
    code, _, err = run_cli("report", str(run_dir))
    assert code == 2
    assert err.startswith(f"error: {run_dir / 'steps.jsonl'}: holds 0 steps, results.json counts 6;")
    assert snapshot(run_dir) == before


def test_report_of_a_killed_run_refuses_requests_without_steps(tmp_path):
    write_run(tmp_path)  # no summaries: a killed run; rebuilt from the records alone
    (tmp_path / "steps.jsonl").write_text("")
    before = snapshot(tmp_path)
    with pytest.raises(KvplanError, match=r"steps.jsonl: holds no steps, requests.jsonl 3 finished requests;"):
        render_report(tmp_path)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d.update(workload="x"), "results.json: workload: must be a mapping (got 'x')"),
        (lambda d: d["levels"][0].update(ttft_ms="abc"), "results.json: levels[0].ttft_ms: "),
    ],
)
def test_report_on_a_damaged_results_json_is_one_line(tmp_path, damage, message):
    from tests.kvplan.cli_runner import run_cli

    run_dir = tmp_path
    write_run(run_dir)
    data = load_run(run_dir)
    results = summarize(data.result, data.requests, data.steps).model_dump(mode="json")
    damage(results)
    (run_dir / "results.json").write_text(json.dumps(results))
    code, _, err = run_cli("report", str(run_dir))
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"error: {run_dir}/{message}"), err


def test_report_json_prints_the_summary_and_writes_nothing(tmp_path):
    from tests.kvplan.cli_runner import run_cli

    run_dir = finished_run(tmp_path / "run")
    before = snapshot(run_dir)
    code, out, err = run_cli("report", str(run_dir), "--json")
    assert (code, err) == (0, "") and snapshot(run_dir) == before
    summary = json.loads(out)
    assert (summary["source"], summary["workload"], summary["status"]) == ("measured", "t", "running")
    (bucket,) = summary["buckets"]
    assert (bucket["name"], bucket["knee"], bucket["slo_max_concurrency"]) == ("b", 4, None)
    assert [(lv["mode"], lv["level"], lv["preemptions"], lv["peak_used_blocks"]) for lv in bucket["levels"]] == [
        ("closed", 1.0, 0, 4),
        ("closed", 4.0, 2, 10),
    ]
    # c=1: requests a (0.0 -> 0.1, 0.2, 0.3) and b (0.3 -> 0.5, 0.6): TTFT 100 and 200 ms
    ttft = bucket["levels"][0]["ttft_ms"]
    assert (ttft["mean"], ttft["p50"]) == (pytest.approx(150.0), pytest.approx(150.0))
    assert bucket["levels"][0]["num_completed"] == 2 and bucket["levels"][0][
        "output_throughput_tok_s"
    ] == pytest.approx(5 / 0.6)  # 3 + 2 tokens from the first arrival (0.0 s) to the last finish (0.6 s)


def test_report_json_of_a_killed_run_computes_summaries_without_saving_them(tmp_path):
    from tests.kvplan.cli_runner import run_cli

    write_run(tmp_path)  # no summaries yet
    before = snapshot(tmp_path)
    code, out, _ = run_cli("report", str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["buckets"][0]["knee"] == 4
    assert snapshot(tmp_path) == before
