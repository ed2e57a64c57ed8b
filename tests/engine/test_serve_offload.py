"""KV offload tiers through ``python -m engine.serve`` and the workload's ``engine.offload:``: the
/metrics counters by tier equal the hand count of tests/engine/test_offload.py's scenario, a
client that disconnects leaks no block in any tier, and a tier that cannot work is one line at
start (exit 2 from the server, a KvplanError naming ``engine.offload.<key>`` from kvplan)."""

from __future__ import annotations

import json
import socket
import time

import pytest

from engine.serve.app import main
from tests.engine.test_offload import BLOCK_BYTES, A, B, gib
from tests.engine.test_serve import Served, metric, post
from tests.engine.tiny import random_prompts, tiny_engine


@pytest.fixture(scope="module")
def served():
    server = Served(tiny_engine(num_blocks=6, offload_host_gib=gib(8)))
    yield server
    server.close()


def complete(url: str, prompt: list[int]) -> str:
    status, raw = post(
        f"{url}/v1/completions", {"prompt": prompt, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    )
    assert status == 200
    return json.loads(raw)["choices"][0]["text"]


def test_metrics_count_stores_loads_and_hits_by_tier(served):
    """A, B, A one after another on a pool of 6 blocks (test_offload's scenario): B evicts A's
    4 cached blocks to host (4 stores), A again loads them (4 loads, 16 hit tokens) and its take
    evicts 4 of B's (4 more stores): host holds 8."""
    first = complete(served.url, A)
    complete(served.url, B)
    assert complete(served.url, A) == first
    label = '{model_name="tiny-random-llama",tier="host"}'
    assert metric(served.url, f"kvplan_engine_offload_stores_total{label}") == 8
    assert metric(served.url, f"kvplan_engine_offload_loads_total{label}") == 4
    assert metric(served.url, f"kvplan_engine_offload_hit_tokens_total{label}") == 16
    assert metric(served.url, f"kvplan_engine_offload_blocks{label}") == 8
    moved = 'kvplan_engine_offload_bytes_total{direction="%s",model_name="tiny-random-llama"}'
    assert metric(served.url, moved % "stored") == 8 * BLOCK_BYTES
    assert metric(served.url, moved % "loaded") == 4 * BLOCK_BYTES
    assert metric(served.url, "vllm:prefix_cache_hits_total") == 16  # every tier's hits count as prefix hits


def test_a_client_that_disconnects_leaks_no_block_in_any_tier(served):
    host, port = served.url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": random_prompts([17], seed=8)[0], "max_tokens": 5, "ignore_eos": True, "stream": True})
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body.encode()
    )
    got = b""
    while got.count(b"data: ") < 2:
        got += sock.recv(4096)
    sock.close()
    deadline = time.time() + 20
    while time.time() < deadline and (served.engine.scheduler.num_used_blocks or served.engine.has_unfinished()):
        time.sleep(0.05)
    assert served.engine.scheduler.num_used_blocks == 0 and not served.engine.has_unfinished()
    served.engine.scheduler.block_manager.offload.check()


def test_a_bad_tier_is_one_line_and_exit_2(capsys, tmp_path):
    args = ["--model", "tiny-random-llama", "--port", "0", "--kv-offload-disk-gib", "1"]
    assert main([*args, "--kv-offload-disk-path", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: offload_disk_path: must be an existing directory")
    assert main(["--model", "tiny-random-llama", "--port", "0", "--kv-offload-host-gib", "1e-9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: offload_host_gib: must hold at least one KV block of")


def test_the_workload_section_reaches_the_engine_and_its_errors_name_the_yaml_key(tmp_path):
    from kvplan.errors import KvplanError
    from kvplan.run.bundled.backend import build_engine
    from kvplan.workload.file import load_workload

    def workload(offload: str):
        path = tmp_path / "w.yaml"
        path.write_text(
            "name: w\nseed: 0\n"
            "engine: {model: tiny-random-llama, dtype: float32, block_size: 4, num_blocks: 6, offload: "
            + offload
            + "}\n"
            "dataset: random\n"
            "buckets:\n  - {name: s, input_tokens: 8, output_tokens: 2, concurrency: [1], num_requests: 2}\n"
        )
        return load_workload(path)

    engine = build_engine(workload(f"{{host_gib: {gib(3)}, disk_gib: {gib(5)}, disk_path: {tmp_path}}}"))
    tiers = engine.scheduler.block_manager.offload.tiers
    assert [(t.name, t.capacity) for t in tiers] == [("host", 3), ("disk", 5)]
    with pytest.raises(KvplanError) as caught:
        build_engine(workload(f"{{disk_gib: 1, disk_path: {tmp_path / 'absent'}}}"))
    assert str(caught.value).endswith(
        f"engine.offload.disk_path: must be an existing directory (got '{tmp_path / 'absent'}')"
    )
    with pytest.raises(KvplanError, match=r"engine\.offload: give disk_gib and disk_path together"):
        workload("{disk_gib: 1}")
