"""`kvplan compare A B` / `kvplan report A --compare B`: levels paired by key, each metric's
error (A - B) / B in %, and a table and a PNG per metric written beside A."""

import pytest

from kvplan.cli.compare import compare_views
from kvplan.results.metrics import LatencyStats, LevelSummary
from kvplan.results.records import LevelKey
from kvplan.results.report.compare import (
    METRICS,
    compare_table,
    error_pct,
    unpaired_levels,
    wide_table,
    write_comparison,
)
from kvplan.results.run_result import RunInfo, RunResult, WorkloadRef, save_result
from tests.kvplan.cli_runner import run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def level(mode, value, ttft, tpot, tok_s, preemptions=0):
    stats = lambda ms: LatencyStats(count=4, mean=ms, p50=ms, p90=ms, p95=ms * 1.5, p99=ms * 2)  # noqa: E731
    return LevelSummary(
        bucket="short",
        mode=mode,
        level=value,
        num_requests=4,
        num_completed=4,
        num_failed=0,
        num_cannot_fit=0,
        num_oom=0,
        num_aborted=0,
        duration_s=1.0,
        ttft_ms=stats(ttft),
        tpot_ms=stats(tpot),
        itl_ms=stats(tpot),
        e2e_ms=stats(ttft + 10 * tpot),
        output_tokens_per_s=tok_s,
        total_tokens_per_s=tok_s * 2,
        requests_per_s=4.0,
        goodput_rps=4.0,
        slo_attainment=1.0,
        num_steps=10,
        num_preemptions=preemptions,
        num_preempted_requests=0,
        num_total_blocks=48,
        peak_used_blocks=20 + preemptions,
        mean_used_blocks=10.0,
        peak_kv_usage=0.5,
        mean_kv_usage=0.2,
        mean_queue_len=0.0,
        max_queue_len=0,
        peak_ideal_bytes=0,
        peak_paged_bytes=0,
        peak_contiguous_bytes=0,
        peak_measured_bytes=0,
        max_paged_error_bytes=0,
        prefix_hit_rate=None,
    )


def run(source, levels):
    return RunResult(
        source=source,
        status="complete",
        started_at="now",
        workload=WorkloadRef(name="w"),
        run=RunInfo(kvplan_version="0", python="3", platform="p"),
        levels=levels,
    )


SIMULATED = run(
    "simulated",
    [
        level("closed", 1, 22.0, 18.0, 55.0),
        level("closed", 8, 33.0, 24.0, 300.0, 2),
        level("open", 2.0, 30.0, 19.0, 100.0),
    ],
)
MEASURED = run(
    "measured",
    [
        level("closed", 1, 20.0, 20.0, 50.0),
        level("closed", 4, 25.0, 20.0, 190.0),
        level("closed", 8, 30.0, 24.0, 320.0, 2),
    ],
)


def test_error_is_relative_to_b():
    assert error_pct(110.0, 100.0) == pytest.approx(10.0) and error_pct(90.0, 100.0) == pytest.approx(-10.0)
    assert error_pct(0, 0) == 0.0 and error_pct(1, 0) is None and error_pct(None, 3) is None


def test_levels_pair_by_key_and_every_metric_gets_its_error():
    frame = compare_table(SIMULATED, MEASURED)
    assert sorted(set(frame["level"])) == ["c=1", "c=8"]  # c=4 and 2 req/s ran on one side only
    assert len(frame) == 2 * len(METRICS)
    row = frame[(frame["level"] == "c=1") & (frame["metric"] == "TTFT P50 ms")].iloc[0]
    assert (row["A"], row["B"], row["error %"]) == (22.0, 20.0, pytest.approx(10.0))
    row = frame[(frame["level"] == "c=8") & (frame["metric"] == "output tok/s")].iloc[0]
    assert row["error %"] == pytest.approx((300 - 320) / 320 * 100)
    wide = wide_table(frame, ("TPOT P50 ms",))
    assert wide.to_dict("records") == [
        {"bucket": "short", "level": "c=1", "TPOT P50 A": 18.0, "TPOT P50 B": 20.0, "TPOT P50 err %": -10.0},
        {"bucket": "short", "level": "c=8", "TPOT P50 A": 24.0, "TPOT P50 B": 24.0, "TPOT P50 err %": 0.0},
    ]


def test_the_comparison_is_written_beside_a_and_printed(tmp_path):
    a, b = tmp_path / "sim", tmp_path / "measured"
    for folder, result in ((a, SIMULATED), (b, MEASURED)):
        folder.mkdir()
        save_result(folder, result)
    out, frame = write_comparison(a, b)
    assert out == a / "compare-measured"
    assert (out / "compare.csv").read_text().splitlines()[0] == "bucket,level,metric,A,B,error %"
    assert "| short | c=1 | TTFT P50 ms | 22 | 20 | 10 |" in (out / "compare.md").read_text()
    for stem, _ in METRICS.values():
        assert (out / f"{stem}.png").read_bytes()[:8] == PNG_MAGIC
    code, printed, err = run_cli("compare", str(a), str(b))
    assert (code, err) == (0, "") and printed.rstrip().endswith(f"comparison: {out}")
    assert "A " in printed and "err % = (A - B) / B" in printed
    code, _, err = run_cli("compare", str(a), str(tmp_path / "nothing"))
    assert code == 2 and err.startswith(f"error: {tmp_path / 'nothing'}: no results.json here")


def test_the_levels_only_one_run_has_are_named_as_left_out(tmp_path, capsys):
    """Was silent: A's 2 req/s and B's c=4 ran on one side only and were dropped without a word."""
    a, b, same = tmp_path / "sim", tmp_path / "measured", tmp_path / "same"
    for folder, result in ((a, SIMULATED), (b, MEASURED), (same, SIMULATED)):
        folder.mkdir()
        save_result(folder, result)
    assert unpaired_levels(SIMULATED, MEASURED) == ([LevelKey("short", "open", 2.0)], [LevelKey("short", "closed", 4)])
    only_a, only_b = f"left out, only in A ({a}): short 2 req/s", f"left out, only in B ({b}): short c=4"
    code, printed, err = run_cli("compare", str(a), str(b))
    assert (code, err) == (0, "")
    assert printed.splitlines()[-3:] == [only_a, only_b, f"comparison: {a / 'compare-measured'}"]
    md = (a / "compare-measured" / "compare.md").read_text()
    assert md.endswith("\nleft out, only in A (sim): short 2 req/s\n\nleft out, only in B (measured): short c=4\n")
    compare_views(a, b, quiet=True)  # `kvplan report A --compare B --json`: stdout is the JSON's
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == [
        f"warning: compare: {only_a}",
        f"warning: compare: {only_b}",
    ]
    code, printed, err = run_cli("compare", str(a), str(same))  # every level pairs: nothing left out
    assert (code, err) == (0, "") and "left out" not in printed
    assert "left out" not in (a / "compare-same" / "compare.md").read_text()
