"""`kvplan gate` on real runs of workloads/ci.yaml: two runs repeat the same KV trace, an unchanged
run passes, a smaller KV pool fails naming the metrics, and bad input is one line with exit 2.

The expected capacity numbers come from ci.yaml's shape, by hand: blocks of 4 tokens; a long
request holds 64 + 32 - 1 = 95 tokens of KV (its last output token is never fed back), that is
24 blocks, so one in flight peaks at 24 blocks, two at 48 (the whole 48-block pool) and three
cannot all fit; a short request holds at most 24 + 16 - 1 = 39 tokens, 10 blocks, so four in
flight fit in 40 blocks and eight cannot.
"""

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml

from kvplan.errors import KvplanError
from kvplan.gate.baseline import Baseline, load_baseline
from kvplan.gate.gate import check_same_workload, compare, run_gate
from kvplan.gate.values import CheckKey
from kvplan.gate.view import describe_failure
from kvplan.results.gated import METRICS, METRICS_BY_NAME, Tolerance
from kvplan.results.run_result import load_run
from kvplan.workload.file import parse_workload
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[3]
CI = ROOT / "workloads" / "ci.yaml"
SMOKE = ROOT / "workloads" / "smoke.yaml"
COMMITTED = ROOT / "baselines" / "ci.yaml"
LEVELS = {"short": (2, 4, 8), "long": (1, 2, 3)}
# 2 run checks + 2 bucket checks per bucket + 10 level checks per level.
NUM_CHECKS = 2 + 2 * len(LEVELS) + 10 * sum(len(v) for v in LEVELS.values())
CAPACITY = [m.name for m in METRICS if m.default == Tolerance()]
TIMED = {m.name for m in METRICS if m.default != Tolerance()}  # wall-clock metrics


def loadtest(workload: Path, out: Path) -> Path:
    """``kvplan loadtest`` with one torch thread, as .ci/run runs it (OMP_NUM_THREADS=1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code, _, err = run_cli("loadtest", str(workload), "--out", str(out), "--quiet")
    finally:
        torch.set_num_threads(threads)
    assert (code, err) == (0, ""), err
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two consecutive runs of ci.yaml."""
    root = tmp_path_factory.mktemp("gate")
    return [loadtest(CI, root / name) for name in ("a", "b")]


@pytest.fixture(scope="module")
def baseline(runs, tmp_path_factory):
    path = tmp_path_factory.mktemp("baseline") / "ci.yaml"
    code, out, err = run_cli("gate", str(runs[0]), "--baseline", str(path), "--update-baseline")
    assert (code, err) == (0, "")
    assert out.strip() == f"baseline written: {path} ({NUM_CHECKS} values from {runs[0]})"
    return path


def kv_trace(run_dir: Path):
    """Every step's record but its clock times, and every request's preemptions and lengths."""
    data = load_run(run_dir)
    steps = [{k: v for k, v in asdict(s).items() if k not in ("start_time", "end_time")} for s in data.steps]
    requests = sorted(
        (r.request_id, r.num_preemptions, r.num_prompt_tokens, r.num_output_tokens, r.finish_reason)
        for r in data.requests
    )
    return data, steps, requests


def test_two_runs_of_ci_yaml_have_identical_kv_traces(runs):
    (a, steps_a, requests_a), (b, steps_b, requests_b) = kv_trace(runs[0]), kv_trace(runs[1])
    assert len(steps_a) > 1000 and steps_a == steps_b
    assert requests_a == requests_b
    preemptions = {(lv.bucket, lv.level): lv.num_preemptions for lv in a.result.levels}
    assert preemptions == {(lv.bucket, lv.level): lv.num_preemptions for lv in b.result.levels}
    # The hand-computed capacity of the module docstring.
    assert [preemptions[("short", n)] == 0 for n in (2.0, 4.0, 8.0)] == [True, True, False]
    assert [preemptions[("long", n)] == 0 for n in (1.0, 2.0, 3.0)] == [True, True, False]
    peaks = {(lv.bucket, lv.level): lv.peak_used_blocks for lv in a.result.levels}
    assert (peaks[("long", 1.0)], peaks[("long", 2.0)], peaks[("long", 3.0)]) == (24, 48, 48)
    assert peaks[("short", 4.0)] <= 40
    knees = [(k.name, k.measured_knee, k.max_clean_concurrency) for k in a.result.buckets]
    assert knees == [("short", 8, 4), ("long", 3, 2)]
    assert all(r[4] == "length" for r in requests_a)


def test_an_unchanged_run_passes(runs, baseline, tmp_path):
    """A wall-clock metric can miss even its wide tolerance when the shared machine stalls a level
    (TPOT P95 22.5 ms against 1.88 in one CI run): such a miss, and only such, is retried on a fresh
    run, twice at most; the capacity checks never are."""
    run = runs[1]
    for attempt in range(3):
        junit = tmp_path / f"out{attempt}" / "gate.xml"
        code, out, err = run_cli("gate", str(run), "--baseline", str(baseline), "--junit", str(junit))
        missed = {line.split()[1] for line in out.splitlines() if line.startswith("REGRESSION ")}
        if code == 0 or not missed or not missed <= TIMED or attempt == 2:
            break
        run = loadtest(CI, tmp_path / f"rerun{attempt}")
    assert (code, err) == (0, ""), out
    assert out.splitlines()[-1] == f"gate: {NUM_CHECKS} passed, 0 failed"
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert (len(cases), suite.get("failures")) == (NUM_CHECKS, "0")
    assert ("measured_knee", "kvplan.gate.ci.long") in {(c.get("name"), c.get("classname")) for c in cases}
    assert ("num_preemptions [c=8]", "kvplan.gate.ci.short") in {(c.get("name"), c.get("classname")) for c in cases}


def test_the_workloads_gate_section_overrides_the_baseline_files_tolerances(runs, baseline, tmp_path):
    text = baseline.read_text()
    saved = yaml.safe_load(text)["tolerances"]
    # The file lists the tolerances in force: ci.yaml's gate: section where it sets one (and says
    # so in its header), the catalog default elsewhere.
    assert saved["ttft_p99_ms"] == {"worse": "higher", "abs": 20.0, "rel": 9.0}
    assert saved["ttft_p95_ms"] == {"worse": "higher", "abs": 10.0, "rel": 9.0}
    assert saved["num_preemptions"] == {"worse": "higher", "abs": 0.0, "rel": 0.0}
    assert (
        "# from the workload's gate: section (edit them there): output_tokens_per_s, goodput_rps, "
        "ttft_p95_ms, ttft_p99_ms, tpot_p95_ms, tpot_p99_ms\n"
    ) in text
    # Editing such a tolerance in the baseline file changes nothing: the workload's section wins.
    edited = tmp_path / "edited.yaml"
    edited.write_text(
        text.replace(
            "ttft_p99_ms: {worse: higher, abs: 20.0, rel: 9.0}", "ttft_p99_ms: {worse: higher, abs: 0.0, rel: 0.0}"
        )
    )
    assert yaml.safe_load(edited.read_text())["tolerances"]["ttft_p99_ms"]["rel"] == 0.0
    result = run_gate(runs[1], edited)
    assert any(
        n.startswith("tolerances from the workload's gate: section (they win over the baseline file's)")
        for n in result.notes
    )
    ttft = next(c for c in result.checks if c.key == CheckKey("ttft_p99_ms", "short", "c=2"))
    assert (ttft.tolerance.rel, ttft.tolerance.abs) == (9.0, 20.0)  # ci.yaml's gate: section
    assert ttft.limit == pytest.approx(ttft.baseline * 10 + 20)
    knee = next(c for c in result.checks if c.key == CheckKey("measured_knee", "long"))
    assert (knee.baseline, knee.current, knee.limit, knee.tolerance.describe()) == (3, 3, 3.0, "-0")


def test_a_smaller_kv_pool_fails_with_exit_1_naming_the_metrics(runs, baseline, tmp_path):
    smaller = tmp_path / "ci.yaml"  # same workload, 40 blocks instead of 48: an injected regression
    smaller.write_text(CI.read_text().replace("num_blocks: 48", "num_blocks: 40"))
    run_dir = loadtest(smaller, tmp_path / "run")
    junit = tmp_path / "gate.xml"
    code, out, err = run_cli("gate", str(run_dir), "--baseline", str(baseline), "--junit", str(junit))
    assert (code, err) == (1, "")
    assert "note: engine settings differ from the baseline: num_blocks 48 -> 40" in out
    # Two long requests need 48 blocks: with 40 the long knee drops from 3 to 2.
    regressions = [line for line in out.splitlines() if line.startswith("REGRESSION ")]
    assert "REGRESSION kv_pool_tokens [(run)]: baseline 192, current 160 tokens, limit 192" in out
    assert "REGRESSION measured_knee [long]: baseline 3, current 2 requests, limit 3" in out
    assert "REGRESSION max_clean_concurrency [long]: baseline 2, current 1 requests, limit 2" in out
    assert any(line.startswith("REGRESSION num_preemptions [long c=2]: baseline 0, current ") for line in regressions)
    failed = {
        (c.get("classname"), c.get("name")): c.find("failure") for c in ET.parse(junit).getroot().iter("testcase")
    }
    assert (
        failed[("kvplan.gate.ci.long", "measured_knee")]
        .get("message")
        .startswith("measured_knee [long]: baseline 3, current 2")
    )
    assert failed[("kvplan.gate.ci.run", "kv_bytes_per_token")] is None
    assert out.splitlines()[-1] == f"gate: {NUM_CHECKS - len(regressions)} passed, {len(regressions)} failed"


def test_a_baseline_from_another_workload_exits_2_with_one_line(runs, tmp_path):
    smoke_baseline = tmp_path / "smoke.yaml"
    run_dir = loadtest(SMOKE, tmp_path / "smoke")
    assert run_cli("gate", str(run_dir), "--baseline", str(smoke_baseline), "--update-baseline")[0] == 0
    code, out, err = run_cli("gate", str(runs[0]), "--baseline", str(smoke_baseline))
    assert (code, out) == (2, "")
    assert err == (
        f"error: {smoke_baseline}: workload: recorded for workload 'smoke', the run is of 'ci'; "
        "pass this workload's baseline, or record one with --update-baseline\n"
    )
    # Recording over it is refused the same way: it would silently become ci's baseline.
    recorded = smoke_baseline.read_text()
    code, out, err = run_cli("gate", str(runs[0]), "--baseline", str(smoke_baseline), "--update-baseline")
    assert (code, out) == (2, "")
    assert err == (
        f"error: {smoke_baseline}: workload: will not overwrite the baseline of workload 'smoke' with a"
        " run of 'ci'; choose another --baseline path (or delete that file)\n"
    )
    assert smoke_baseline.read_text() == recorded


def test_a_baseline_of_other_traffic_under_the_same_name_exits_2(runs, baseline, tmp_path):
    doc = yaml.safe_load(baseline.read_text())
    doc["workload"]["config"]["buckets"][1]["num_requests"] = 17
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, _, err = run_cli("gate", str(runs[1]), "--baseline", str(other))
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: {other}: workload: recorded for another version of workload 'ci' (buckets differ);")


def test_the_committed_baseline_is_of_ci_yaml_and_its_capacity_holds(runs):
    baseline = load_baseline(COMMITTED)
    result = load_run(runs[0]).result
    assert check_same_workload(baseline, result, runs[0]) == []  # same traffic and engine settings
    result = run_gate(runs[0], COMMITTED)
    capacity = [c for c in result.checks if c.key.metric in CAPACITY]
    assert len(capacity) == 2 + 2 * len(LEVELS) + 4 * 6
    assert [c for c in capacity if not c.passed] == []
    assert {c.key.metric: c.baseline for c in capacity if not c.key.bucket} == {
        "kv_bytes_per_token": 2 * 2 * 2 * 16 * 4,  # fp32, 2 layers, K and V, 2 KV heads, head_dim 16
        "kv_pool_tokens": 48 * 4,
    }


def test_update_baseline_keeps_the_files_tolerances(runs, baseline, tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text(
        baseline.read_text().replace(
            "num_preemptions: {worse: higher, abs: 0.0, rel: 0.0}",
            "num_preemptions: {worse: higher, abs: 7.0, rel: 0.0}",
        )
    )
    assert run_cli("gate", str(runs[1]), "--baseline", str(path), "--update-baseline")[0] == 0
    doc = yaml.safe_load(path.read_text())
    assert doc["tolerances"]["num_preemptions"] == {"worse": "higher", "abs": 7.0, "rel": 0.0}
    assert doc["recorded"]["run_dir"] == str(runs[1])
    level = json.loads((runs[1] / "results.json").read_text())["levels"][0]
    assert doc["values"]["short c=2"]["tpot_p95_ms"] == pytest.approx(level["tpot_ms"]["p95"], rel=1e-5)


def test_a_larger_pool_passes_although_the_peak_rises_where_the_baseline_was_pool_bound(runs, baseline, tmp_path):
    # 96 blocks instead of 48: nothing preempts any more, so at short c=8 (8 x up to 10 blocks)
    # and long c=3 (3 x 24 = 72 blocks) more blocks are resident at once than the baseline's
    # pool allowed. That is more capacity, not a regression: the peak is held only at levels
    # where the baseline did not preempt (there the demand is the same, and so is the peak).
    larger = tmp_path / "ci.yaml"
    larger.write_text(CI.read_text().replace("num_blocks: 48", "num_blocks: 96"))
    run_dir = loadtest(larger, tmp_path / "run")
    result = run_gate(run_dir, baseline)
    timed = {m.name for m in METRICS if m.unit in ("ms", "tokens/s", "requests/s")}
    if result.regressions and all(c.key.metric in timed for c in result.regressions):
        # a level stalled by the shared machine reads as a timing regression (the CI suite saw
        # tpot_p95_ms at long c=3 once): once more on a fresh run, as .ci/run reruns its gate
        run_dir = loadtest(larger, tmp_path / "rerun")
        result = run_gate(run_dir, baseline)
    assert result.exit_code == 0, [c.key for c in result.regressions]
    peaks = {
        c.key.scope_label: (c.baseline, c.current, c.limit) for c in result.checks if c.key.metric == "peak_used_blocks"
    }
    assert peaks["long c=3"] == (48, 72, math.inf)
    assert peaks["long c=1"] == (24, 24, 24)
    assert peaks["short c=8"][1] > peaks["short c=8"][0] and peaks["short c=8"][2] == math.inf
    assert (
        "peak_used_blocks not held at 2 level(s) where the baseline preempted (e.g. short c=8): the peak "
        "there was the pool's size, not the demand"
    ) in result.notes
    knees = {c.key.bucket: (c.baseline, c.current) for c in result.checks if c.key.metric == "measured_knee"}
    assert knees == {"short": (8, None), "long": (3, None)}  # no level preempts: the best value


# ---- bad input: one line, exit 2 --------------------------------------------------------------
def test_a_baseline_without_values_is_refused(runs, baseline, tmp_path):
    doc = yaml.safe_load(baseline.read_text())
    doc["values"] = {}
    empty = tmp_path / "empty.yaml"
    empty.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, out, err = run_cli("gate", str(runs[0]), "--baseline", str(empty))
    assert (code, out) == (2, "")
    assert err == (
        f"error: {empty}: values: empty: a baseline that checks nothing cannot pass a run; record one "
        "with: kvplan gate RUN_DIR --baseline FILE --update-baseline\n"
    )


def test_a_baseline_path_that_cannot_be_written_is_one_line(runs, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = run_cli("gate", str(runs[0]), "--baseline", str(blocker / "b.yaml"), "--update-baseline")
    assert (code, out) == (2, "")
    assert (
        err.startswith(f"error: --baseline: cannot make the folder of {blocker / 'b.yaml'} (")
        and len(err.splitlines()) == 1
    )
    folder = tmp_path / "is-a-folder.yaml"
    (folder / "inside").mkdir(parents=True)
    code, out, err = run_cli("gate", str(runs[0]), "--baseline", str(folder), "--update-baseline")
    assert code == 2 and err == f"error: --baseline: {folder} is a folder; give the path of a YAML file\n"


def test_update_baseline_never_overwrites_a_file_that_is_not_a_baseline(runs, tmp_path):
    target = tmp_path / "workload.yaml"
    target.write_text(CI.read_text())
    code, _, err = run_cli("gate", str(runs[0]), "--baseline", str(target), "--update-baseline")
    assert code == 2 and target.read_text() == CI.read_text()
    assert err.startswith(f"error: --baseline: will not overwrite {target}: not a kvplan gate baseline")


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: d["tolerances"].update(ttft_p96_ms={"rel": 1.0}),
            "tolerances: unknown metric 'ttft_p96_ms'; use one of kv_bytes_per_token, ",
        ),
        (
            lambda d: d["values"]["short c=2"].update(queue_len=3),
            "values.short c=2.queue_len: unknown metric; use one of kv_bytes_per_token, ",
        ),
        (
            lambda d: d["values"]["short c=2"].update(measured_knee=8),
            "values.short c=2.measured_knee: is a bucket metric, not a level one",
        ),
        (
            lambda d: d["tolerances"]["goodput_rps"].update(rel="half"),
            "tolerances.goodput_rps.rel: must be a number (got 'half')",
        ),
    ],
)
def test_a_bad_baseline_is_one_line(runs, baseline, tmp_path, edit, message):
    doc = yaml.safe_load(baseline.read_text())
    edit(doc)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, out, err = run_cli("gate", str(runs[0]), "--baseline", str(bad))
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {bad}: {message}") and len(err.splitlines()) == 1


def test_missing_files_and_unfinished_runs_are_one_line(runs, baseline, tmp_path):
    cases = [
        (tmp_path / "nowhere", baseline, f"error: {tmp_path / 'nowhere'}: no results.json here"),
        (runs[0], tmp_path / "none.yaml", f"error: {tmp_path / 'none.yaml'}: no such baseline file; record one with"),
    ]
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    results = json.loads((runs[0] / "results.json").read_text())
    (unfinished / "results.json").write_text(json.dumps({**results, "status": "interrupted"}))
    cases.append((unfinished, baseline, f"error: {unfinished / 'results.json'}: status: the run is 'interrupted'"))
    for run_dir, path, start in cases:
        code, out, err = run_cli("gate", str(run_dir), "--baseline", str(path))
        assert (code, out) == (2, "") and err.startswith(start) and len(err.splitlines()) == 1, err
    code, _, err = run_cli("gate", str(runs[0]), "--baseline", str(baseline), "--update-baseline", "--junit", "j.xml")
    assert (code, err) == (
        2,
        "error: --junit: there are no checks to write with --update-baseline; drop one of the two\n",
    )


def test_an_option_without_its_value_points_at_the_commands_help():
    assert run_cli("gate", "run", "--baseline") == (
        2,
        "",
        "error: Option '--baseline' requires an argument; see `kvplan gate --help`\n",
    )


def test_an_unknown_metric_in_a_workloads_gate_section_is_one_line():
    data = yaml.safe_load(CI.read_text())
    data["gate"]["tolerances"]["itl_p95_ms"] = {"rel": 1.0}
    with pytest.raises(KvplanError) as caught:
        parse_workload(data, "ci.yaml")
    assert str(caught.value).startswith("ci.yaml: gate.tolerances: unknown metric 'itl_p95_ms'; use one of")


# ---- the comparison rule, on hand-made values -------------------------------------------------
def _checks(metric: str, pairs, tolerance: Tolerance | None = None):
    """compare() on one metric, each (baseline, current) pair at its own level."""
    keys = [CheckKey(metric, "b", f"c={i}") for i in range(len(pairs))]
    baseline = Baseline(Path("b.yaml"), "w", {}, {}, {}, {k: base for k, (base, _) in zip(keys, pairs)})
    overrides = {metric: tolerance} if tolerance else {}
    return compare(baseline, {k: cur for k, (_, cur) in zip(keys, pairs)}, overrides)


def test_allowed_change_is_abs_plus_rel_times_the_baseline_the_worse_way():
    # higher is worse: 5 ms may rise by 20 + 1.0 x 5 = 25 ms, to 30 ms.
    checks = _checks("ttft_p95_ms", [(5.0, 30.0), (5.0, 30.01), (5.0, 0.1)], Tolerance(rel=1.0, abs=20))
    assert [(c.limit, c.passed) for c in checks] == [(30.0, True), (30.0, False), (30.0, True)]
    # lower is worse (default: may halve): 1,000 tokens/s may fall to 500.
    checks = _checks("output_tokens_per_s", [(1000.0, 500.0), (1000.0, 499.9), (1000.0, 5000.0)])
    assert [(c.limit, c.passed) for c in checks] == [(500.0, True), (500.0, False), (500.0, True)]
    # Zero tolerance: one more preemption fails, one fewer passes.
    checks = _checks("num_preemptions", [(3, 3), (3, 4), (3, 2)])
    assert [c.passed for c in checks] == [True, False, True]
    # A tolerance may flip the direction.
    checks = _checks("peak_used_blocks", [(10, 9), (10, 11)], Tolerance(worse="lower"))
    assert [c.passed for c in checks] == [False, True]


def test_a_missing_knee_is_the_best_value_and_a_missing_latency_the_worst():
    # knee None: no level preempted. A knee appearing is a regression; one vanishing is not.
    checks = _checks("measured_knee", [(None, 8), (8, None), (None, None), (8, 4)])
    assert [c.passed for c in checks] == [False, True, True, False]
    assert checks[0].limit == math.inf
    # TTFT None: no request completed. Losing it fails; a baseline without one holds anything.
    checks = _checks("ttft_p99_ms", [(5.0, None), (None, 1e9), (None, None)])
    assert [c.passed for c in checks] == [False, True, True]
    assert METRICS_BY_NAME["measured_knee"].none_is_best and not METRICS_BY_NAME["ttft_p99_ms"].none_is_best


def test_a_check_missing_from_the_run_fails():
    baseline = Baseline(Path("b.yaml"), "w", {}, {}, {}, {CheckKey("num_preemptions", "b", "c=9"): 0})
    (check,) = compare(baseline, {}, {})
    assert (check.passed, check.missing) == (False, True)
    assert describe_failure(check) == "num_preemptions [b c=9]: baseline 0 preemptions, but this run has no such level"


def test_a_baseline_with_a_duplicate_key_is_refused_in_one_line(tmp_path):
    text = (ROOT / "baselines" / "ci.yaml").read_text()
    bad = tmp_path / "dup.yaml"
    bad.write_text(text.replace("kvplan_gate_baseline: 1\n", "kvplan_gate_baseline: 1\nkvplan_gate_baseline: 1\n", 1))
    with pytest.raises(KvplanError, match=r"dup\.yaml: line \d+: duplicate key 'kvplan_gate_baseline'"):
        load_baseline(bad)


def test_a_baseline_edited_with_an_exponent_reads_it_as_a_number(tmp_path):
    """`rel: 5e-1` was the string '5e-1' to PyYAML (YAML 1.1) and refused."""
    text = COMMITTED.read_text()
    line = "  kv_pool_tokens: {worse: lower, abs: 0.0, rel: 0.0}\n"
    assert line in text
    edited = tmp_path / "edited.yaml"
    edited.write_text(text.replace(line, "  kv_pool_tokens: {worse: lower, abs: 1e1, rel: 5e-1}\n", 1))
    assert load_baseline(edited).tolerances["kv_pool_tokens"] == Tolerance(worse="lower", abs=10.0, rel=0.5)
