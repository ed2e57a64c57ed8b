"""The disaggregated deployment over HTTP (issue 36): ``python -m engine.serve --role prefill``,
``--role decode`` and ``engine.serve.router`` on the tiny random model give an aggregated server's
greedy tokens, move every exported block (bytes counted on both sides, by hand), hold no block
after completions, a cancel while waiting for the decode server and a disconnect mid-stream, and
``kvplan loadtest --target`` against the router records TTFT, TPOT and kv_transfer_s per request."""

import json
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from engine.config import EngineConfig
from engine.disagg.workers import Handoff, worker_engine
from engine.request import SamplingParams
from engine.serve import router
from engine.serve.app import bind, build_app, main
from engine.serve.role_app import build_role_app
from engine.serve.role_loops import handoff_json
from kvplan.run.server.server_metrics import parse_metrics
from tests.engine.test_serve import events, metric, post
from tests.engine.tiny import TINY, random_prompts, tiny_engine

POOL = dict(block_size=4, num_blocks=64, enable_prefix_caching=False, max_num_seqs=8)
SETTINGS = dict(model=TINY, dtype="float32", device="cpu", attention_backend="torch", **POOL)
PER_BLOCK = 2 * 2 * 4 * 2 * 16 * 4  # K and V x 2 layers x block_size 4 x 2 KV heads x head_dim 16 x fp32 bytes
ROOT = Path(__file__).resolve().parents[2]


class Up:
    """An ASGI app on a free port in a thread (uvicorn), stopped by ``close``."""

    def __init__(self, app):
        import uvicorn

        sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


class Deployment:
    """1 prefill + 1 decode server and a router in front."""

    def __init__(self, **decode_overrides):
        self.prefill = Up(build_role_app(worker_engine(EngineConfig(**SETTINGS), "prefill"), "prefill"))
        config = EngineConfig(**{**SETTINGS, **decode_overrides})
        self.decode = Up(build_role_app(worker_engine(config, "decode"), "decode"))
        self.router = Up(router.build_router([self.prefill.url], [self.decode.url]))
        self.pw, self.dw = self.prefill.app.state.worker, self.decode.app.state.worker

    def idle(self, timeout_s: float = 20) -> bool:
        """Whether, within ``timeout_s``, no block is held or used on either side and nothing runs."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            busy = self.pw.has_unfinished() or self.dw.has_unfinished() or self.pw.scheduler.held
            used = self.pw.scheduler.block_manager.num_used_blocks + self.dw.scheduler.block_manager.num_used_blocks
            if not busy and used == 0:
                return True
            time.sleep(0.05)
        return False

    def close(self):
        for up in (self.router, self.decode, self.prefill):
            up.close()


@pytest.fixture(scope="module")
def deployment():
    d = Deployment()
    yield d
    d.close()


def body(prompt, max_tokens, stream):
    b = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}
    return {**b, "stream_options": {"include_usage": True}} if stream else b


def answer(url: str, b: dict) -> tuple[str, dict]:
    status, raw = post(f"{url}/v1/completions", b)
    assert status == 200, raw
    if not b["stream"]:
        obj = json.loads(raw)
        return obj["choices"][0]["text"], obj
    chunks = events(raw)
    assert chunks[-1] == "[DONE]"
    return "".join(c["choices"][0]["text"] for c in chunks[:-2] if c["choices"]), chunks[-2]


def test_router_gives_the_aggregated_servers_greedy_tokens_and_moves_every_block(deployment):
    prompts = random_prompts([5, 12, 8, 17, 3, 9, 21, 4], seed=5)
    bodies = [body(p, 6 + i % 4, stream=i % 2 == 0) for i, p in enumerate(prompts)]
    aggregated = Up(build_app(tiny_engine(**POOL)))
    try:
        with ThreadPoolExecutor(8) as pool:
            want = list(pool.map(lambda b: answer(aggregated.url, b), bodies))
            got = list(pool.map(lambda b: answer(deployment.router.url, b), bodies))
    finally:
        aggregated.close()
    assert [g[0] for g in got] == [w[0] for w in want]
    assert all(g[0].count("<") == b["max_tokens"] for g, b in zip(got, bodies))  # tokens as <id>: all of them
    for (_, last), b, p in zip(got, bodies, prompts):
        assert last["usage"] == {
            "prompt_tokens": len(p),
            "completion_tokens": b["max_tokens"],
            "total_tokens": len(p) + b["max_tokens"],
        }
        assert last["kv_transfer_s"] > 0
    # every block that left the prefill server arrived: ceil(prompt / 4) blocks of 1,024 bytes each
    num_blocks = sum(-(-len(p) // 4) for p in prompts)
    assert deployment.idle()
    pw, dw = deployment.pw, deployment.dw
    assert pw.engine.bytes_per_block == PER_BLOCK
    assert pw.num_exported_blocks == dw.num_imported_blocks == num_blocks
    assert pw.num_exported_bytes == dw.num_imported_bytes == num_blocks * PER_BLOCK
    assert metric(deployment.prefill.url, "kvplan_kv_exported_bytes_total") == num_blocks * PER_BLOCK
    assert metric(deployment.decode.url, "kvplan_kv_imported_bytes_total") == num_blocks * PER_BLOCK
    assert metric(deployment.decode.url, "kvplan_kv_imported_blocks_total") == num_blocks
    assert metric(deployment.decode.url, "kvplan_kv_transfer_seconds_count") == len(prompts)
    assert metric(deployment.decode.url, "kvplan_kv_transfer_seconds_sum") == pytest.approx(dw.transfer_seconds)
    assert metric(deployment.prefill.url, "kvplan_handoffs_held") == 0
    assert metric(deployment.decode.url, "kvplan_handoffs_waiting") == 0
    assert metric(deployment.decode.url, "vllm:kv_cache_usage_perc") == 0
    # the decode server computed no prompt token; the prefill server one token per request
    assert metric(deployment.decode.url, "vllm:prompt_tokens_total") == 0
    assert metric(deployment.prefill.url, "vllm:prompt_tokens_total") == sum(map(len, prompts))
    assert metric(deployment.prefill.url, "vllm:generation_tokens_total") == len(prompts)
    # the router's /metrics: every server's, labelled by server, read as kvplan reads a data-parallel vLLM
    text = urllib.request.urlopen(f"{deployment.router.url}/metrics").read().decode()
    read = parse_metrics(text)
    assert read.values["prompt_tokens_total"] == sum(map(len, prompts))
    assert read.values["generation_tokens_total"] == sum(b["max_tokens"] for b in bodies)  # token 1 + decode's
    assert read.pool["num_gpu_blocks"] == "64" and 'server="decode0"' in text and 'server="prefill0"' in text
    assert f'kvplan_kv_imported_bytes_total{{model_name="{TINY}",server="decode0"}} {num_blocks * PER_BLOCK}.0' in text


def test_one_token_ends_at_the_prefill_server_and_bad_bodies_are_its_400s(deployment):
    exported = deployment.pw.num_exported_blocks
    text, last = answer(deployment.router.url, body([7, 8, 9], 1, stream=True))
    assert text.count("<") == 1 and last["kv_transfer_s"] is None and last["usage"]["completion_tokens"] == 1
    assert deployment.pw.num_exported_blocks == exported and deployment.idle()
    status, raw = post(f"{deployment.router.url}/v1/completions", {"prompt": [], "max_tokens": 2})
    assert status == 400 and b"prompt" in raw
    status, raw = post(
        f"{deployment.router.url}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 400 and b"chat template" in raw  # the tiny model has none
    models = json.loads(urllib.request.urlopen(f"{deployment.router.url}/v1/models").read())
    assert models["data"][0]["id"] == TINY


def stream_then_drop(url: str, prompt, max_tokens: int, num_events: int) -> None:
    """Open a stream, read ``num_events`` SSE events, then close the connection."""
    host, port = url.removeprefix("http://").split(":")
    raw = json.dumps(body(prompt, max_tokens, stream=True)).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    got = b""
    while got.count(b"data: ") < num_events:
        got += sock.recv(4096)
    sock.close()


def test_a_disconnect_mid_stream_frees_the_blocks_on_both_sides(deployment):
    stream_then_drop(deployment.router.url, random_prompts([30], seed=6)[0], 200, 4)  # token 1 + a few decoded
    assert deployment.idle()
    assert metric(deployment.decode.url, "vllm:num_requests_running") == 0


def test_a_cancel_while_the_handoff_waits_frees_the_held_blocks():
    d = Deployment(max_num_seqs=1)  # the decode server runs one request: the next handoff waits
    try:
        first = threading.Thread(target=answer, args=(d.router.url, body([5] * 9, 120, stream=True)))
        first.start()
        while not d.dw.scheduler.num_running:
            time.sleep(0.01)
        stream_then_drop(d.router.url, random_prompts([13], seed=7)[0], 50, 1)  # token 1 only: it waits
        assert d.pw.scheduler.held or d.dw.num_waiting_handoffs  # held at the prefill server until cancelled
        first.join(60)
        assert d.idle()
        assert d.dw.num_transfers == 1 and d.pw.num_exported_blocks == 3  # the first only: ceil(9 / 4)
    finally:
        d.close()


def test_a_request_the_decode_server_can_never_run_is_a_400_before_any_prefill():
    # the decode pool: 8 blocks of 4 tokens, max_model_len 40; the prefill server's: 64 blocks, 256
    d = Deployment(num_blocks=8, max_model_len=40)
    try:
        before = d.pw.engine._step_index
        prompt = random_prompts([20], seed=9)[0]
        for stream in (False, True):  # 20 + 16 tokens: ceil(35 / 4) = 9 blocks > 8 (36 <= 40)
            status, raw = post(f"{d.router.url}/v1/completions", body(prompt, 16, stream))
            assert status == 400, raw
            message = json.loads(raw)["error"]["message"]
            assert (
                message
                == "the decode server: the request (20 + 16 tokens) needs more than the KV pool's 8 blocks of 4 tokens"
            )
        status, raw = post(f"{d.router.url}/v1/completions", body(prompt, 21, False))  # 41 > 40 tokens
        assert status == 400 and json.loads(raw)["error"]["message"].startswith(
            "the decode server: this model's maximum context length is 40 tokens; the request has 20 prompt"
        )
        assert d.pw.engine._step_index == before and d.idle()  # refused before any prefill step
        text, _ = answer(d.router.url, body(prompt, 13, stream=True))  # 20 + 13: ceil(32 / 4) = 8 blocks: fits
        assert text.count("<") == 13 and d.idle()
        # the limits as the prefill server reads them: all three, positive integers
        bad = f"{d.prefill.url}/kv/prefill/completion?request_id=x&decode_num_blocks=0"
        status, raw = post(bad, body([5, 6], 2, False))
        assert status == 400 and "decode_max_model_len, decode_block_size, decode_num_blocks" in raw.decode()
    finally:
        d.close()


def test_an_abort_before_its_request_arrives_and_a_failed_fetch_hold_nothing(deployment):
    # the router's cancel can overtake its request: the prefill server answers it "abort" at once
    assert post(f"{deployment.prefill.url}/kv/abort/early", b"")[0] == 200
    status, raw = post(f"{deployment.prefill.url}/kv/prefill/completion?request_id=early", body([5, 6, 7], 4, False))
    assert status == 200 and json.loads(raw)["finish_reason"] == "abort" and json.loads(raw)["handoff"] is None
    # a handoff whose source holds nothing: the fetch gets a 404, the decode server frees its blocks
    handoff = Handoff("ghost", (5, 6, 7, 8, 9), 11, SamplingParams(max_tokens=4), 0.0, 0.0, 4)
    offer = {"handoff": handoff_json(handoff), "source": deployment.prefill.url, "first_text": "<11>"}
    status, raw = post(f"{deployment.decode.url}/kv/decode", offer)
    assert status == 200 and [json.loads(line)["finish_reason"] for line in raw.splitlines()] == ["abort"]
    assert deployment.idle() and deployment.dw.num_waiting_handoffs == 0 and not deployment.dw.in_transfer


def test_two_prefill_and_two_decode_servers_take_requests_round_robin():
    engines = {r: [worker_engine(EngineConfig(**SETTINGS), r) for _ in range(2)] for r in ("prefill", "decode")}
    servers = {r: [Up(build_role_app(e, r)) for e in es] for r, es in engines.items()}
    front = Up(router.build_router([u.url for u in servers["prefill"]], [u.url for u in servers["decode"]]))
    try:
        prompts = random_prompts([5, 12, 8, 17], seed=8)
        for p in prompts:  # one at a time: request i is the router's i-th
            assert answer(front.url, body(p, 3, stream=True))[0].count("<") == 3
        assert [-(-len(p) // 4) for p in prompts] == [2, 3, 2, 5]  # blocks per request
        # request i: prefill server i mod 2, decode server i mod 2
        assert [u.app.state.worker.num_exported_blocks for u in servers["prefill"]] == [2 + 2, 3 + 5]
        assert [u.app.state.worker.num_imported_blocks for u in servers["decode"]] == [2 + 2, 3 + 5]
        assert [u.app.state.worker.num_transfers for u in servers["decode"]] == [2, 2]
    finally:
        for u in (front, *servers["decode"], *servers["prefill"]):
            u.close()


def test_kvplan_loadtest_against_the_router_records_ttft_tpot_and_transfer_time(deployment, tmp_path):
    from kvplan.results.run_result import load_run
    from kvplan.run.server.run import run_target_loadtest
    from kvplan.workload.file import load_workload

    doc = yaml.safe_load((ROOT / "workloads" / "ci.yaml").read_text())
    doc["buckets"] = [
        {"name": "short", "input_tokens": [8, 24], "output_tokens": 8, "concurrency": [2], "num_requests": 6}
    ]
    doc.pop("gate")
    doc["target"] = {"url": f"{deployment.router.url}/v1", "vocab_size": 512}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(doc))
    run = load_run(run_target_loadtest(load_workload(path), tmp_path / "run"))
    assert len(run.requests) == 6
    for r in run.requests:
        assert r.finish_reason == "length" and r.num_output_tokens == 8
        assert r.kv_transfer_s is not None and r.kv_transfer_s > 0
        assert r.token_times[0] > r.arrival_time and len(r.token_times) == 8
    level = run.result.levels[0]
    assert level.ttft_ms.p50 > 0 and level.tpot_ms.p50 > 0
    assert level.server_preemptions == 0  # read from the servers' metrics through the router
    assert deployment.idle()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--role", "both"], "error: role: must be one of aggregated, prefill, decode (got 'both')"),
        (["--role", "decode", "--model", TINY, "--max-num-waiting", "4"], "error: max_num_waiting: admission"),
        (["--role", "prefill", "--tenant-header", "X-T"], "error: tenant_header: not supported on a prefill server"),
        (["--role", "decode", "--kv-offload-host-gib", "1"], "error: kv_offload_host_gib: not supported on a decode"),
    ],
)
def test_bad_role_settings_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--decode", "http://127.0.0.1:1"], "error: prefill: names no server"),
        (["--prefill", "http://127.0.0.1:1", "--decode", "127.0.0.1:2"], "error: decode: '127.0.0.1:2' is not an http"),
    ],
)
def test_bad_router_flags_are_one_line_and_exit_2(argv, message, capsys):
    assert router.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
