"""`kvplan loadtest --target` against the fake server: the run result, server metrics per level,
failures by reason, pre-flight errors before any level, a server dying mid-run, no torch."""

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.results.run_result import load_run
from kvplan.results.summary_json import summary_json
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[4]


def workload(tmp_path: Path, **target) -> Path:
    """Closed loop c=1 and c=4 and 50 req/s, 8 random requests of 12 output tokens each."""
    doc = {
        "name": "t",
        "seed": 0,
        "dataset": "random",
        "slo": {"ttft_ms": 5000},
        "buckets": [
            {
                "name": "short",
                "input_tokens": [8, 16],
                "output_tokens": 12,
                "concurrency": [1, 4],
                "request_rates": [50],
                "num_requests": 8,
            }
        ],
        "target": {"vocab_size": 512, "scrape_interval_ms": 20, **target},
    }
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_target_run_measures_every_request_and_reads_the_servers_metrics(tmp_path, fake):
    server = fake(interval_s=0.002)
    run_dir = tmp_path / "run"
    code, out, err = run_cli(
        "loadtest", str(workload(tmp_path)), "--target", server.url, "--out", str(run_dir), "--quiet"
    )
    assert (code, err) == (0, ""), err
    data = load_run(run_dir)
    result = data.result
    assert result.source == "target" and result.engine is None and result.status == "complete"
    assert (result.server.url, result.server.model, result.server.metrics_available) == (server.url, "fake-model", True)
    assert (result.server.num_gpu_blocks, result.server.block_size, result.server.pool_tokens) == (48, 4, 192)
    assert len(data.requests) == 24 and not data.steps
    for r in data.requests:
        assert r.finish_reason == "length" and r.num_output_tokens == r.max_tokens == 12
        assert r.output_tokens_source == "usage" and len(r.token_times) == 12
        assert 0 < r.token_times[0] - r.arrival_time < r.finish_time - r.arrival_time
        assert r.sent_time is not None and r.sent_time >= r.arrival_time - 1e-9 or r.mode == "open"
    # The fake's preemption counter counts requests served: 8 per level, exactly, across each level.
    assert [lv.server_preemptions for lv in result.levels] == [8, 8, 8]
    assert all(lv.server_peak_kv_usage == 0.25 for lv in result.levels)
    assert result.buckets[0].measured_knee == 1  # the server "preempted" at every level
    # vLLM's fields were asked for (the fake says it is vLLM): exact lengths and a cache salt per level.
    body = server.bodies[0]
    assert body["ignore_eos"] is True and body["min_tokens"] == 12 == body["max_tokens"]
    assert body["stream_options"] == {"include_usage": True} and body["temperature"] == 0.0
    # the salt of level short/closed/1, as a digest vLLM accepts (it refuses '/': HTTP 400)
    assert isinstance(body["prompt"], list)
    assert body["cache_salt"] == "kvplan-" + hashlib.sha256(b"short/closed/1").hexdigest()[:32]
    opened = result.levels[2]
    assert (opened.requested_rate, opened.mode) == (50.0, "open") and opened.achieved_rate > 0
    summary = summary_json(result)
    assert summary["server"] == {
        "url": server.url,
        "model": "fake-model",
        "metrics_available": True,
        "num_gpu_blocks": 48,
        "block_size": 4,
        "pool_tokens": 192,
        "pool_source": "vllm:cache_config_info",
        "num_slots": None,
        "slot_ctx_tokens": None,
        "kv_usage_metric": "vllm:kv_cache_usage_perc",
        "kv_usage_note": None,
    }
    level = summary["buckets"][0]["levels"][0]
    assert (level["server_preemptions"], level["server_peak_kv_usage"], level["preemptions"]) == (8, 0.25, 8)
    assert level["peak_used_blocks"] is None
    assert len(result.client) == 3 and all(c.workers == 1 and c.cpu_s > 0 for c in result.client)
    assert "## Server (remote target)" in (run_dir / "summary.md").read_text()


def test_without_metrics_the_server_side_is_unavailable_not_zero(tmp_path, fake):
    server = fake(metrics=False, owned_by="huggingface")
    run_dir = tmp_path / "run"
    code, _, err = run_cli(
        "loadtest", str(workload(tmp_path)), "--target", server.url, "--out", str(run_dir), "--quiet"
    )
    assert code == 0, err
    result = load_run(run_dir).result
    assert result.server.metrics_available is False and result.server.num_gpu_blocks is None
    assert all(lv.server_preemptions is None and lv.server_peak_kv_usage is None for lv in result.levels)
    assert result.buckets[0].measured_knee is None and result.buckets[0].max_clean_concurrency is None
    assert "ignore_eos" not in server.bodies[0] and "cache_salt" not in server.bodies[0]  # not vLLM: max_tokens only
    level = summary_json(result)["buckets"][0]["levels"][0]
    assert level["preemptions"] is None and level["server_preemptions"] is None


@pytest.mark.parametrize(
    ("status", "finish"),
    [(503, "error"), (429, "rejected")],  # a 429 is the server shedding load (admission), not a failure
)
def test_failed_and_shed_requests_are_counted_by_reason_and_kept_out_of_latency(tmp_path, fake, status, finish):
    server = fake(status=status)
    run_dir = tmp_path / "run"
    code, _, err = run_cli(
        "loadtest", str(workload(tmp_path)), "--target", server.url, "--out", str(run_dir), "--quiet"
    )
    assert code == 0, err
    data = load_run(run_dir)
    # an error keeps its status; a refusal, the message of the server's error body (the fake's "refused")
    reason = f"http {status}" if finish == "error" else "refused"
    assert all((r.finish_reason, r.finish_detail) == (finish, reason) for r in data.requests)
    for lv in data.result.levels:
        assert (lv.num_completed, lv.ttft_ms) == (0, None)
        if finish == "error":
            assert (lv.num_errors, lv.error_reasons, lv.num_rejected, lv.shed_fraction) == (8, {reason: 8}, 0, 0.0)
        else:
            assert (lv.num_errors, lv.num_rejected, lv.rejected_reasons, lv.shed_fraction) == (0, 8, {reason: 8}, 1.0)


def test_a_server_that_dies_mid_run_leaves_a_valid_partial_report(tmp_path, fake):
    server = fake(die_after=10, interval_s=0.002)
    run_dir = tmp_path / "run"
    code, out, err = run_cli(
        "loadtest", str(workload(tmp_path)), "--target", server.url, "--out", str(run_dir), "--quiet"
    )
    assert code == 1 and err.count("\n") == 1 and "stopped: the server stopped answering" in err
    result = load_run(run_dir).result
    assert result.status == "interrupted" and "stopped answering" in result.stop_reason
    done = sum(lv.num_completed for lv in result.levels)
    assert 8 <= done <= 10 and result.levels[0].num_completed == 8
    code, out, err = run_cli("report", str(run_dir), "--json")
    assert code == 0 and json.loads(out)["status"] == "interrupted"


class WebPage(http.server.BaseHTTPRequestHandler):
    """A web server that is not an OpenAI one: an HTML page at every path."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>hello</html>")

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("case", ["unreachable", "not_openai", "wrong_model", "no_key", "bad_key"])
def test_bad_targets_fail_in_one_line_before_any_level(tmp_path, fake, case, monkeypatch):
    extra = {}
    if case == "unreachable":
        url = "http://127.0.0.1:9/v1"  # the discard port: nothing listens
        expect = "--target: cannot reach http://127.0.0.1:9/v1"
    elif case == "not_openai":
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WebPage)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        expect = "not an OpenAI-compatible server: GET " + url + "/models gave no model list"
    elif case == "wrong_model":
        url, extra = fake().url, {"model": "llama-9000"}
        expect = "target.model: 'llama-9000' is not served at"
    else:
        url = fake(api_key="s3cret").url
        if case == "bad_key":
            monkeypatch.setenv("KVPLAN_TEST_KEY", "wrong")
            extra = {"api_key_env": "KVPLAN_TEST_KEY"}
        expect = "the server refused the request (HTTP 401 on GET /v1/models)"
    run_dir = tmp_path / "run"
    code, out, err = run_cli("loadtest", str(workload(tmp_path, **extra)), "--target", url, "--out", str(run_dir))
    assert code == 2 and out == "" and err.count("\n") == 1 and expect in err, err
    assert not run_dir.exists()
    if case == "not_openai":
        httpd.shutdown()


def test_the_api_key_comes_from_the_named_environment_variable(tmp_path, fake, monkeypatch):
    server = fake(api_key="s3cret")
    monkeypatch.setenv("KVPLAN_TEST_KEY", "s3cret")
    code, _, err = run_cli(
        "loadtest",
        str(workload(tmp_path, api_key_env="KVPLAN_TEST_KEY")),
        "--target",
        server.url,
        "--out",
        str(tmp_path / "run"),
        "--quiet",
    )
    assert code == 0, err
    monkeypatch.delenv("KVPLAN_TEST_KEY")
    code, _, err = run_cli(
        "loadtest",
        str(workload(tmp_path, api_key_env="KVPLAN_TEST_KEY")),
        "--target",
        server.url,
        "--out",
        str(tmp_path / "run2"),
    )
    assert code == 2 and "target.api_key_env: the environment variable KVPLAN_TEST_KEY is not set" in err


def test_a_target_run_imports_no_torch(tmp_path):
    """In a fresh interpreter that refuses torch, transformers and triton, a target run works."""
    run_dir = tmp_path / "run"
    program = f"""
import sys, importlib.abc
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'triton'):
            raise ImportError('refused: ' + name)
sys.meta_path.insert(0, Refuse())
from tests.kvplan.run.server.fake_server import FakeServer, Options
server = FakeServer(Options()).start()
sys.argv = [
    'kvplan', 'loadtest', {str(workload(tmp_path))!r}, '--target', server.url, '--out', {str(run_dir)!r}, '--quiet'
]
from kvplan.cli import main
try:
    main()
except SystemExit as done:
    assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'triton')]
    sys.exit(done.code)
"""
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert load_run(run_dir).result.status == "complete"


def test_a_target_run_keeps_warmup_and_cooldown_out_of_its_statistics(tmp_path, fake):
    """The same steady-state keys against a remote server: 2 warm-up and 3 cool-down requests
    around the 8 measured at c=4, recorded and excluded; latencies over the 8 alone."""
    server = fake(interval_s=0.002)
    path = workload(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["buckets"][0].update({"concurrency": [4], "request_rates": [], "warmup": 2, "cooldown": 3})
    path.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    code, out, err = run_cli("loadtest", str(path), "--target", server.url, "--out", str(run_dir), "--quiet")
    assert (code, err) == (0, ""), err
    data = load_run(run_dir)
    (level,) = data.result.levels
    index = {r: int(r.request_id.rsplit("/", 1)[1]) for r in data.requests}
    assert sorted(index.values()) == list(range(2 + 8 + 3))
    measured = [r for r in data.requests if 2 <= index[r] < 10]
    assert (level.num_requests, level.num_excluded) == (8, 5)
    e2e = sorted((r.finish_time - r.arrival_time) * 1e3 for r in measured)
    assert level.e2e_ms.count == 8 and level.e2e_ms.mean == pytest.approx(sum(e2e) / 8)
    assert summary_json(data.result)["buckets"][0]["levels"][0]["num_excluded"] == 5


# vLLM 0.32's cache_salt rule (docs/target.md): at most 128 characters, no '@', '/', '\' or NUL.
def vllm_accepts_salt(salt: str) -> bool:
    return len(salt) <= 128 and not any(c in salt for c in "@/\\\x00")


@settings(max_examples=200, deadline=None)
@given(
    bucket=st.text(min_size=1, max_size=300),
    mode=st.sampled_from(["closed", "open"]),
    value=st.one_of(st.integers(1, 10**9), st.floats(0.001, 1e9)),
    variant=st.sampled_from(["", "cached", "uncached", "alone:chat", "small/steps", "v@1 alone:doc"]),
    index=st.integers(0, 10**6),
    tenant=st.one_of(st.none(), st.integers(0, 10**4)),
    cycle=st.integers(1, 1000),
)
def test_every_salt_kvplan_can_make_goes_on_the_wire_as_one_vllm_accepts(
    bucket, mode, value, variant, index, tenant, cycle
):
    from kvplan.results.records import LevelKey
    from kvplan.run.driver import cache_salt, round_salt
    from kvplan.run.server.backend import wire_salt
    from kvplan.traffic.requests import SampledRequest

    key = LevelKey(bucket, mode, value, variant)
    request = SampledRequest((1, 2, 3), 4, "random", tenant=tenant)
    salt = round_salt(cache_salt(key, index, request), index, cycle)
    wire = wire_salt(salt)
    assert vllm_accepts_salt(wire)
    assert wire == "kvplan-" + hashlib.sha256(salt.encode()).hexdigest()[:32]  # one wire salt per salt
    assert wire_salt(salt + "x") != wire
