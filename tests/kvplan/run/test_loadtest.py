"""`kvplan loadtest` end to end on the tiny random model: files, exact KV accounting, the knee,
Poisson arrivals, and a run interrupted by Ctrl-C that `kvplan report` still renders."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvplan.results.run_result import load_run
from kvplan.run.bundled.backend import build_engine
from kvplan.run.loadtest import run_loadtest
from kvplan.workload.file import load_workload
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "workloads" / "smoke.yaml"
# tiny-random-llama in float32: 2 layers x (K and V) x 2 KV heads x head_dim 16 x 4 bytes.
BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # 512
BLOCK_SIZE, NUM_BLOCKS = 4, 48  # smoke.yaml
MAX_MODEL_LEN = NUM_BLOCKS * BLOCK_SIZE  # 192: the engine caps max_model_len at the pool's tokens


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    code, out, err = run_cli("loadtest", str(SMOKE), "--out", str(run_dir), "--quiet")
    assert (code, err) == (0, ""), err
    assert out.strip() == f"report: {run_dir}"
    return load_run(run_dir)


def test_smoke_run_writes_every_report_file(smoke):
    names = {p.name for p in smoke.run_dir.iterdir()}
    assert {
        "results.json",
        "requests.jsonl",
        "steps.jsonl",
        "requests.csv",
        "steps.csv",
        "summary.md",
        "workload.yaml",
        "kv_over_time.png",
        "latency_short.png",
        "latency_short_open.png",
        "throughput_goodput.png",
        "kv_estimate_vs_measured.png",
    } <= names
    result = smoke.result
    assert result.status == "complete" and result.schema_version == 2 and result.source == "measured"
    assert json.loads((smoke.run_dir / "results.json").read_text())["schema_version"] == 2
    assert result.engine.num_blocks == NUM_BLOCKS and result.engine.bytes_per_block == BLOCK_SIZE * BYTES_PER_TOKEN
    assert result.estimate.bytes_per_token == BYTES_PER_TOKEN
    # 4 levels (c=1, 4, 8 and 200 req/s) x 8 requests, each producing exactly max_tokens (ignore_eos).
    assert len(smoke.requests) == 32
    assert all(r.finish_reason == "length" and r.num_output_tokens == r.max_tokens == 12 for r in smoke.requests)
    assert [(lv.mode, lv.level, lv.num_completed) for lv in result.levels] == [
        ("closed", 1.0, 8),
        ("closed", 4.0, 8),
        ("closed", 8.0, 8),
        ("open", 200.0, 8),
    ]


def test_measured_kv_equals_the_paged_estimate_at_every_step(smoke):
    assert len(smoke.steps) > 50
    for s in smoke.steps:
        blocks = sum(math.ceil(t / BLOCK_SIZE) for t in s.kv_resident_tokens)
        assert s.num_used_blocks == blocks, s.step_index
        assert s.measured_bytes == s.paged_bytes == blocks * BLOCK_SIZE * BYTES_PER_TOKEN
        assert s.ideal_bytes == sum(s.kv_resident_tokens) * BYTES_PER_TOKEN
        assert s.contiguous_bytes == len(s.kv_resident_tokens) * MAX_MODEL_LEN * BYTES_PER_TOKEN
    assert smoke.result.kv.max_paged_error_bytes == 0


def test_closed_loop_keeps_n_in_flight_and_the_knee_shows(smoke):
    by_level = {lv.level: lv for lv in smoke.result.levels if lv.mode == "closed"}
    for n in (1, 4, 8):
        steps = [s for s in smoke.steps if s.mode == "closed" and s.level == n]
        assert max(s.num_running + s.num_waiting for s in steps) == n
    # 4 requests of at most 20 + 12 tokens hold at most 4 x 8 = 32 of 48 blocks: no preemption.
    assert by_level[4.0].num_preemptions == 0 and by_level[8.0].num_preemptions > 0
    bucket = smoke.result.buckets[0]
    assert (bucket.measured_knee, bucket.max_clean_concurrency) == (8, 4)
    # Predicted: P95 of prompt + output tokens, in whole blocks, into the 48-block pool.
    lengths = [r.num_prompt_tokens + r.max_tokens for r in smoke.requests if r.level == 1.0]
    p95 = math.ceil(np.percentile(lengths, 95))
    assert bucket.p95_request_tokens == p95
    assert bucket.predicted_max_concurrency == NUM_BLOCKS // math.ceil(p95 / BLOCK_SIZE)


def test_open_loop_arrivals_follow_the_seeded_poisson_schedule(smoke):
    opened = sorted((r for r in smoke.requests if r.mode == "open"), key=lambda r: int(r.request_id.rsplit("/", 1)[1]))
    gaps = np.random.default_rng([0, 0, 200_000]).exponential(1 / 200, size=8)
    expected = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    arrivals = np.array([r.arrival_time for r in opened])
    assert np.allclose(arrivals - arrivals[0], expected, atol=1e-9)


def test_every_level_replays_the_same_requests(smoke):
    shapes = {}
    for r in smoke.requests:
        index = int(r.request_id.rsplit("/", 1)[1])
        shapes.setdefault(index, set()).add((r.num_prompt_tokens, r.max_tokens))
    assert len(shapes) == 8 and all(len(s) == 1 for s in shapes.values())


def test_an_interrupted_run_keeps_a_report_that_kvplan_report_renders(tmp_path):
    workload = load_workload(SMOKE)
    engine = build_engine(workload)
    real_step, calls = engine.step, []

    def step_then_ctrl_c():
        calls.append(1)
        if len(calls) == 2 + 110:  # after the warm-up's 2 steps (kvplan.run.bundled.backend.warm_up)
            raise KeyboardInterrupt
        return real_step()

    engine.step = step_then_ctrl_c
    run_dir = run_loadtest(workload, tmp_path / "run", engine=engine)
    data = load_run(run_dir)
    assert data.result.status == "interrupted"
    # A request takes 12 steps (one prefill, 11 decodes): c=1 ends after step 96; c=4 admits 4
    # at once, which finish at step 108. Ctrl-C comes in the 110th call after the warm-up: 109 steps
    # were recorded.
    assert len(data.steps) == 109
    assert len(data.requests) == 12
    # c=4 finished 4 of its 8 planned requests: partial, and so not a level "without preemption".
    assert [(lv.level, lv.num_completed, lv.num_planned, lv.partial) for lv in data.result.levels] == [
        (1.0, 8, 8, False),
        (4.0, 4, 8, True),
    ]
    assert data.result.buckets[0].max_clean_concurrency == 1
    summary = (run_dir / "summary.md").read_text()
    assert "| short | c=1 | 8/8 |" in summary and "| short | c=4 partial | 4/8 |" in summary

    (run_dir / "summary.md").unlink()
    code, out, err = run_cli("report", str(run_dir))
    assert (code, err) == (0, "")
    assert out.rstrip().endswith(f"report: {run_dir}")
    assert "interrupted (Ctrl-C)" in (run_dir / "summary.md").read_text()
    assert json.loads((run_dir / "results.json").read_text())["status"] == "interrupted"


def test_plan_targets_size_the_bucket_on_production_gpus(smoke):
    (target,) = smoke.result.estimate.plan
    # Llama-3.1-8B, fp8 KV: 32 layers x (K and V) x 8 KV heads x head_dim 128 x 1 byte.
    assert (target.model, target.gpu, target.kv_cache_dtype) == ("llama-3.1-8b", "L4", "fp8")
    assert target.bytes_per_token == 32 * 2 * 8 * 128
    p95 = smoke.result.buckets[0].p95_request_tokens
    blocks_per_request = math.ceil(p95 / 16)  # vLLM's default block size
    assert [(b.name, b.max_concurrency) for b in target.buckets] == [("short", target.num_blocks // blocks_per_request)]


def test_an_unknown_plan_gpu_stops_before_the_model_loads(tmp_path):
    path = ROOT / "tests" / "kvplan" / "data" / "bad_workloads" / "unknown_plan_gpu.yaml"
    code, out, err = run_cli("loadtest", str(path), "--out", str(tmp_path / "run"))
    assert code == 2 and out == ""
    # the closest names, and no CLI flag or other field in a plan entry's fix
    assert err == f"error: {path}: plan[0].gpu: unknown GPU 'H900'; closest: H200, GH200, H20\n"
    assert len(err.splitlines()) == 1 and not (tmp_path / "run").exists()
    # A model that leaves no KV budget: the fix names the entry's own fields, not the CLI's flags.
    big = tmp_path / "big.yaml"
    big.write_text(path.read_text().replace("H900", "L4").replace("llama-3.1-8b", "llama-3.1-405b"))
    code, out, err = run_cli("loadtest", str(big), "--out", str(tmp_path / "run"))
    assert code == 2 and err.startswith(f"error: {big}: plan[0]: weights 755.96 GiB + overhead 2.00 GiB")
    assert err.rstrip().endswith("; use a larger gpu, a higher tp or a smaller weight_dtype in this plan entry"), err


def test_engine_settings_the_engine_refuses_are_one_line(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(SMOKE.read_text().replace("block_size: 4", "block_size: 4\n  max_model_len: 1000"))
    code, out, err = run_cli("loadtest", str(path), "--out", str(tmp_path / "run"))
    assert code == 2
    assert err.strip() == (
        f"error: {path}: engine.max_model_len: must be <= the model's max_position_embeddings 256 (got 1000)"
    )
    assert not (tmp_path / "run").exists()


def test_loadtest_refuses_a_non_empty_out_folder(tmp_path):
    (tmp_path / "results.json").write_text("{}")
    code, _, err = run_cli("loadtest", str(ROOT / "workloads" / "smoke.yaml"), "--out", str(tmp_path), "--quiet")
    assert code == 2
    assert err.strip() == f"error: --out: {tmp_path} is not empty; give a new folder (or remove that one)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def stop_at_step(monkeypatch, count: int) -> None:
    """Make every engine's ``count``-th step() raise KeyboardInterrupt, as Ctrl-C would."""
    from engine.llm_engine import LLMEngine

    real_step, calls = LLMEngine.step, []

    def step(self):
        calls.append(1)
        if len(calls) == count:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(LLMEngine, "step", step)


def test_kvplan_loadtest_interrupted_exits_130_and_says_what_it_kept(tmp_path, monkeypatch):
    stop_at_step(monkeypatch, 30)  # c=1: requests 0 and 1 took steps 1-24; request 2 was running
    run_dir = tmp_path / "run"
    code, out, err = run_cli("loadtest", str(SMOKE), "--out", str(run_dir))
    assert code == 130
    assert err == f"interrupted: the report keeps the requests that finished ({run_dir})\n"
    assert out.rstrip().endswith(f"report: {run_dir}")
    assert "2/8" in out and "c=1 partial" in out  # the console table: done / planned
    result = load_run(run_dir).result
    assert (result.status, result.report_written) == ("interrupted", True)


def test_ctrl_c_while_the_report_is_written_says_to_run_kvplan_report(tmp_path, monkeypatch):
    import kvplan.results.report.render

    def interrupted(data):
        raise KeyboardInterrupt

    path = tmp_path / "w.yaml"  # one level of 4 requests, to be quick
    path.write_text(
        SMOKE.read_text()
        .replace("concurrency: [1, 4, 8]", "concurrency: [4]")
        .replace("request_rates: [200]", "")
        .replace("num_requests: 8", "num_requests: 4")
    )
    monkeypatch.setattr(kvplan.results.report.render, "render_charts", interrupted)
    run_dir = tmp_path / "run"
    code, out, err = run_cli("loadtest", str(path), "--out", str(run_dir), "--quiet")
    assert (code, out) == (130, "")
    assert err == (
        f"error: {run_dir}: interrupted while writing the report; the records are saved; "
        f"run `kvplan report {run_dir}` to write it\n"
    )
    result = load_run(run_dir).result
    assert (result.status, result.report_written) == ("complete", False)
    assert not (run_dir / "summary.md").exists()
    monkeypatch.undo()
    code, _, err = run_cli("report", str(run_dir))
    assert (code, err) == (0, "")
    assert load_run(run_dir).result.report_written is True and (run_dir / "summary.md").exists()


def test_an_out_path_that_cannot_be_a_new_folder_is_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    long = tmp_path / ("n" * 300)
    cases = [
        (afile, f"{afile} is a file, not a folder; give a new folder path"),
        (afile / "sub", f"{afile} is a file, so {afile / 'sub'} cannot be a folder; give a new folder path"),
        (long, "over 255 bytes; give a shorter path"),
        # found only when the folder is made, after the engine is built: nothing is left behind
        (
            Path("/proc/kvplan-test"),
            "cannot create folder /proc/kvplan-test (No such file or directory); give a writable folder path",
        ),
        (Path("/sys/kernel/kvplan-test"), "cannot create folder /sys/kernel/kvplan-test"),
    ]
    for out, message in cases:
        code, _, err = run_cli("loadtest", str(SMOKE), "--out", str(out), "--quiet")
        assert code == 2 and len(err.splitlines()) == 1, err
        assert err.startswith("error: --out: ") and message in err, err
    assert afile.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_run_folder_that_cannot_be_made_under_the_default_root_is_one_line(tmp_path):
    from kvplan.errors import KvplanError
    from kvplan.results.store import create_run_dir

    root = tmp_path / "reports"
    root.write_text("")  # a file where the reports folder should be
    with pytest.raises(
        KvplanError,
        match=r"reports: cannot create folder .*/reports/smoke-\d{8}-\d{6} "
        r"\(Not a directory\); pass out",
    ):
        create_run_dir(load_workload(SMOKE).name, None, root)


def test_an_engine_error_names_the_yaml_field_not_the_engine_config_field(monkeypatch):
    import engine.llm_engine
    from engine.config import SettingError
    from kvplan.errors import KvplanError

    def refuse(config):
        raise SettingError("kv_cache_memory_bytes", "1 TiB cannot be allocated on cpu; lower kv_cache_memory_bytes")

    monkeypatch.setattr(engine.llm_engine, "LLMEngine", refuse)
    with pytest.raises(KvplanError) as caught:
        build_engine(load_workload(SMOKE))
    assert str(caught.value) == (
        f"{SMOKE}: engine.kv_cache_memory: 1 TiB cannot be allocated on cpu; lower kv_cache_memory"
    )


def test_a_level_of_one_token_requests_shows_its_blocks(tmp_path):
    """Requests that finish in the step that admits them used to show 0 blocks at every step
    (steps were read after finished requests freed theirs). Fixed 16-token prompts in blocks of
    4 hold 4 blocks each while their one step runs: c=1 peaks at 4 blocks, c=4 at 16."""
    path = tmp_path / "one_token.yaml"
    path.write_text(
        "name: one_token\nseed: 0\n"
        "engine: {model: tiny-random-llama, dtype: float32, block_size: 4, num_blocks: 48,"
        " enable_prefix_caching: false}\n"
        "dataset: random\n"
        "buckets:\n  - {name: short, input_tokens: 16, output_tokens: 1, concurrency: [1, 4], num_requests: 8}\n"
    )
    code, out, err = run_cli("loadtest", str(path), "--out", str(tmp_path / "run"), "--quiet")
    assert (code, err) == (0, ""), err
    run = load_run(tmp_path / "run")
    assert all(s.num_used_blocks == 0 for s in run.steps)  # after every step, as before
    levels = [(lv.level, lv.num_completed, lv.peak_used_blocks) for lv in run.result.levels]
    assert levels == [(1.0, 8, 4), (4.0, 8, 16)]
    summary = json.loads(run_cli("report", str(tmp_path / "run"), "--json")[1])
    assert [lv["peak_used_blocks"] for lv in summary["buckets"][0]["levels"]] == [4, 16]
