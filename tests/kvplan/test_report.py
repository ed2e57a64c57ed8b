"""Reports rebuilt from a saved run: summary.md, CSVs and PNGs, including runs with nothing in them."""

import json

from matplotlib.figure import Figure

from kvplan.report import plots, render_report, tables
from kvplan.results import RequestRecord, RunWriter, StepRecord, load_run, write_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHARTS = ["kv_over_time.png", "latency_b.png", "throughput_goodput.png", "kv_estimate_vs_measured.png"]


def request(rid, level, arrival, tokens):
    return RequestRecord(rid, "b", "closed", level, arrival, arrival, tokens[-1], tuple(tokens), 8, len(tokens),
                         len(tokens), "length", "", 0, 0)


def step(i, level, used, preemptions=0, bytes_per_block=1024):
    return StepRecord(i, "b", "closed", level, i * 0.1, i * 0.1 + 0.05, 0, 1, 1, 0, used, 10 - used, 10,
                      preemptions, 0, 0, 0, 0, (used * 4,), used * 4 * 256, used * bytes_per_block,
                      256 * 256, used * bytes_per_block)


def results_head():
    return {
        "status": "running", "started_at": "2026-11-29T10:00:00+00:00", "finished_at": None,
        "workload": {"name": "t", "source": "t.yaml", "sha256": "ab" * 32,
                     "config": {"slo": {"ttft_ms": 150.0, "tpot_ms": None, "e2e_ms": None}}},
        "run": {"model": "tiny", "device": "cpu", "block_size": 4, "num_blocks": 10, "bytes_per_block": 1024,
                "bytes_per_token": 256, "pool_bytes": 10240, "pool_tokens": 40},
        "estimate": {"bytes_per_token": 256, "bytes_per_block": 1024, "num_blocks": 10, "pool_tokens": 40,
                     "pool_bytes": 10240,
                     "buckets": [{"name": "b", "p95_request_tokens": 14, "blocks_per_request": 4, "max_concurrency": 2}],
                     "plan": []},
    }


def write_run(run_dir):
    """Two closed-loop levels: c=1 with no preemption, c=4 with two."""
    write_results(run_dir, results_head())
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
    assert results["kv"] == {"num_steps": 6, "max_paged_error_bytes": 0, "num_requests": 3}
    for name in CHARTS + ["summary.md", "requests.csv", "steps.csv"]:
        assert (tmp_path / name).stat().st_size > 0, name
    for name in CHARTS:
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    summary = (tmp_path / "summary.md").read_text()
    assert "incomplete" in summary
    assert "| b | 14 | 2 | 4 | 1 |" in summary  # P95 tokens, predicted, measured knee, highest clean level
    assert "TPOT = (E2E latency - TTFT) / (output tokens - 1)" in summary
    assert "Measured KV bytes equal the paged estimate at every one of 6 steps" in summary
    assert "![kv_over_time.png](kv_over_time.png)" in summary


def test_report_of_a_run_with_no_records_says_no_data(tmp_path):
    write_results(tmp_path, {**results_head(), "status": "interrupted"})
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
