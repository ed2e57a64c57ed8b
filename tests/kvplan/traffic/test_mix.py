"""Request classes in one level, classes alone (interference) and engine variants, on the tiny
random model: tests/kvplan/data/mix_tiny.yaml measured once on the engine, then checked against
numbers recomputed here from its requests.csv, and against its simulation step for step."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from kvplan.results.run_result import load_run
from kvplan.run.loadtest import run_loadtest
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import replay_setup
from kvplan.traffic.prompts import sample_buckets
from kvplan.workload.file import load_workload, parse_workload
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.run.sim.test_exactness import SAME  # the step fields the simulator must equal

WORKLOAD = Path(__file__).resolve().parents[1] / "data" / "mix_tiny.yaml"
BAD = Path(__file__).resolve().parents[1] / "data" / "bad_workloads"


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return load_run(run_loadtest(load_workload(WORKLOAD), tmp_path_factory.mktemp("mix") / "run"))


def test_classes_are_drawn_by_weight_into_one_stream_within_their_own_ranges():
    data = {
        "name": "m",
        "seed": 3,
        "engine": {"model": "tiny-random-llama"},
        "dataset": "random",
        "buckets": [
            {"name": "plain", "input_tokens": [4, 9], "output_tokens": 3, "concurrency": [1], "num_requests": 5},
            {
                "name": "support",
                "mix": [
                    {"name": "chat", "weight": 3, "input_tokens": [4, 12], "output_tokens": [4, 8]},
                    {"name": "doc", "weight": 1, "input_tokens": [40, 56], "output_tokens": [2, 4]},
                    {"name": "never", "weight": 0, "input_tokens": 7, "output_tokens": 7},
                ],
                "concurrency": [1],
                "num_requests": 4000,
            },
        ],
    }
    requests = sample_buckets(parse_workload(data), None, 1000).requests
    stream = requests["support"]
    classes = [r.request_class for r in stream]
    assert len(stream) == 4000 and "never" not in classes
    # 3:1 over 4,000 draws: the doc share's standard error is sqrt(0.25 * 0.75 / 4000) = 0.0068
    assert abs(classes.count("doc") / 4000 - 0.25) < 4 * 0.0068
    assert classes[:40].count("doc") not in (0, 40)  # interleaved, not one class after the other
    for r in stream:
        lo, hi, out_lo, out_hi = (4, 12, 4, 8) if r.request_class == "chat" else (40, 56, 2, 4)
        assert lo <= r.num_prompt_tokens <= hi and out_lo <= r.max_tokens <= out_hi
    # the plain bucket draws what it drew alone: a mix beside it changes nothing of it
    alone = sample_buckets(parse_workload({**data, "buckets": data["buckets"][:1]}), None, 1000).requests["plain"]
    assert requests["plain"] == alone and all(r.request_class is None for r in alone)
    # the same seed, the same stream
    assert sample_buckets(parse_workload(data), None, 1000).requests["support"] == stream


def _stats(values_ms):
    return dict(zip(("p50", "p90", "p95", "p99"), np.percentile(np.asarray(values_ms, dtype=float), [50, 90, 95, 99])))


def test_each_class_equals_the_metrics_recomputed_from_its_requests_csv_rows(measured):
    table = pd.read_csv(measured.run_dir / "requests.csv", keep_default_na=False)
    mixed = [lv for lv in measured.result.levels if lv.classes and "alone:" not in lv.variant]
    assert {(lv.mode, lv.variant) for lv in mixed} == {
        (mode, v) for mode in ("closed", "open") for v in ("chunk-16", "whole-prefill")
    }
    slo_ttft = {"chat": 400.0, "doc": 2000.0}  # doc's own SLO replaces the workload's TTFT limit
    for lv in mixed:
        own = table[(table["mode"] == lv.mode) & (table.variant == lv.variant)]
        assert [c.name for c in lv.classes] == ["chat", "doc"]  # the mix's order, whichever finished first
        assert sum(c.num_requests for c in lv.classes) == lv.num_requests == len(own) == 16
        assert sum(c.num_completed for c in lv.classes) == lv.num_completed
        for c in lv.classes:
            rows = own[own.request_class == c.name]
            assert c.num_requests == len(rows) and c.num_completed == (rows.finish_reason == "length").sum()
            for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
                got = getattr(c, metric)
                want = _stats(pd.to_numeric(rows[metric]).to_numpy())
                assert got.count == len(rows)
                for key, value in want.items():
                    assert getattr(got, key) == pytest.approx(value, rel=1e-9), (lv.key, c.name, metric, key)
            ttft, tpot = pd.to_numeric(rows.ttft_ms), pd.to_numeric(rows.tpot_ms)
            good = ((ttft <= slo_ttft[c.name]) & (tpot <= 100.0)).sum()
            assert c.slo_attainment == pytest.approx(good / len(rows))
            assert c.goodput_rps == pytest.approx(good / lv.duration_s)
        assert lv.goodput_rps == pytest.approx(sum(c.goodput_rps for c in lv.classes))


def test_classes_alone_run_their_own_requests_at_their_share_of_the_load(measured):
    by_key = {lv.key: lv for lv in measured.result.levels}
    table = pd.read_csv(measured.run_dir / "requests.csv", keep_default_na=False)
    for lv in [lv for lv in measured.result.levels if lv.classes and "alone:" not in lv.variant]:
        for c in lv.classes:
            alone = by_key[type(lv.key)(lv.bucket, lv.mode, lv.level, f"{lv.variant} alone:{c.name}")]
            rows = table[(table["mode"] == lv.mode) & (table.variant == alone.variant)]
            assert alone.num_requests == c.num_requests == len(rows) and set(rows.request_class) == {c.name}
            assert not alone.partial and alone.classes[0].name == c.name
    # c=4 at shares 3/4 and 1/4: the chat class alone keeps 3 in flight, doc 1 (never 2 at once)
    steps = [s for s in measured.steps if s.mode == "closed" and s.variant == "whole-prefill alone:doc"]
    assert steps and max(s.num_running + s.num_waiting for s in steps) == 1
    steps = [s for s in measured.steps if s.mode == "closed" and s.variant == "whole-prefill alone:chat"]
    assert max(s.num_running + s.num_waiting for s in steps) == 3
    summary = json.loads(run_cli("report", str(measured.run_dir), "--json")[1])
    level = summary["buckets"][0]["levels"][0]
    assert [c["name"] for c in level["classes"]] == [c.name for c in measured.result.levels[0].classes]
    assert {row["name"] for row in level["interference"]} == {"chat", "doc"}
    assert "## Interference: each class mixed against alone" in (measured.run_dir / "summary.md").read_text()
    assert (measured.run_dir / "interference.png").is_file()


def test_variants_run_the_same_requests_on_their_own_engines(measured):
    engines = measured.result.variant_engines
    assert {k: v.max_num_batched_tokens for k, v in engines.items()} == {"chunk-16": 16, "whole-prefill": 128}
    prefills = {}
    for v in engines:
        steps = [s for s in measured.steps if s.variant == v]
        prefills[v] = max(s.num_prefill_tokens + s.num_decode_tokens for s in steps)
    assert prefills["chunk-16"] <= 16 < prefills["whole-prefill"] <= 128
    table = pd.read_csv(measured.run_dir / "requests.csv", keep_default_na=False)

    def shape(variant):
        rows = table[(table.variant == variant) & (table["mode"] == "closed")].sort_values("request_id")
        return [
            (i.rsplit("/", 1)[1], p, m) for i, p, m in zip(rows.request_id, rows.num_prompt_tokens, rows.max_tokens)
        ]

    assert shape("chunk-16") == shape("whole-prefill")
    assert "## Engine variants side by side" in (measured.run_dir / "summary.md").read_text()


def test_the_simulation_equals_the_engine_at_every_step_mixed_alone_and_on_both_variants(measured, tmp_path):
    workload = load_workload(WORKLOAD)
    run = load_run(simulate(workload, replay_setup(workload, measured.run_dir), tmp_path / "sim", search=False))
    mine, theirs = {}, {}
    for steps, out in ((run.steps, mine), (measured.steps, theirs)):
        for s in steps:
            out.setdefault(s.key, []).append(s)
    assert list(mine) == list(theirs) and len(theirs) == 12  # 2 modes x 2 variants x (mixed + 2 alone)
    starts = [s.start_time for s in run.steps]  # one timeline, though each variant has its own scheduler
    assert starts == sorted(starts)
    for key, steps in theirs.items():
        assert len(mine[key]) == len(steps), key
        for a, b in zip(mine[key], steps):
            for field in SAME:
                assert getattr(a, field) == getattr(b, field), (key, b.step_index, field)


def test_a_variant_that_changes_the_servers_engine_is_refused_on_a_target_run(tmp_path):
    code, out, err = run_cli(
        "loadtest", str(BAD / "variant_block_size_on_target.yaml"), "--out", str(tmp_path / "r"), "--quiet"
    )
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "variants[0].engine.block_size: a --target run cannot change the server's engine" in err
    assert not (tmp_path / "r").exists()


def test_the_gate_reads_every_variants_levels(measured, tmp_path):
    baseline = tmp_path / "baseline.yaml"
    assert run_cli("gate", str(measured.run_dir), "--baseline", str(baseline), "--update-baseline")[0] == 0
    values = yaml.safe_load(baseline.read_text())["values"]
    for variant in ("chunk-16", "whole-prefill", "chunk-16 alone:chat", "whole-prefill alone:doc"):
        assert f"support c=4 {variant}" in values and f"support 200 req/s {variant}" in values
    code, out, _ = run_cli("gate", str(measured.run_dir), "--baseline", str(baseline))
    assert code == 0 and "0 failed" in out


def test_the_knee_table_has_a_row_per_engine_variant_and_says_when_no_level_preempted(tmp_path):
    """Two engines on one 24-block pool: ``capped`` runs at most 2 requests at once (2 x 8 blocks fit:
    never preempts), ``open`` runs all 6 at c=6 (6 x up to 8 blocks do not fit). Each row's knee is
    the lowest closed level whose steps preempted, counted here from steps.csv."""
    data = {
        "name": "knees",
        "seed": 0,
        "engine": {"model": "tiny-random-llama", "dtype": "float32", "block_size": 4, "num_blocks": 24},
        "dataset": "random",
        "buckets": [
            {"name": "chat", "input_tokens": [20, 24], "output_tokens": 8, "concurrency": [1, 6], "num_requests": 6}
        ],
        "variants": [
            {"name": "capped", "engine": {"max_num_seqs": 2}},
            {"name": "open", "engine": {"max_num_seqs": 8}},
        ],
    }
    path = tmp_path / "knees.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "run"), "--quiet")
    assert code == 0, err
    steps = pd.read_csv(tmp_path / "run" / "steps.csv", keep_default_na=False)
    closed = steps[steps["mode"] == "closed"]
    preempting = closed[closed.num_preemptions > 0].groupby("variant")["level"].min().to_dict()
    assert "capped" not in preempting and preempting["open"] == 6
    code, out, err = run_cli("report", str(tmp_path / "run"))
    summary = (tmp_path / "run" / "summary.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in summary.splitlines() if "chat " in line}
    assert rows["chat capped"][4] == "none up to c=6"  # the knee column
    assert rows["chat open"][4] == "6"


def test_each_engine_variant_counts_its_own_steps(measured):
    """Step indices restart per engine variant (docs/reports.md): within an engine (a variant and its
    classes alone) they rise by one a step, so they are unique there, while a bare step_index is not."""
    steps = pd.read_csv(measured.run_dir / "steps.csv", keep_default_na=False)
    for variant in ("chunk-16", "whole-prefill"):
        own = steps[steps.variant.str.split(" ").str[0] == variant].step_index.tolist()
        assert own == list(range(own[0], own[0] + len(own)))
    assert steps.step_index.duplicated().any()  # the two engines' indices overlap
