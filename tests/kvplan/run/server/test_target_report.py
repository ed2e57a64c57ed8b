"""A target run's report: a server without /metrics shows its KV side as unavailable, never as 0,
in summary.md and `kvplan report --json`; SGLang's pool and usage gauge as its /metrics name
them; TTFO beside TTFT for streams that carry reasoning; the vocabulary of random prompts."""

import json
import re

import pytest
import yaml

from kvplan.results.run_result import load_run
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.run.server.test_target import workload

# server-side and engine-side KV quantities: a cell under one of these headers is a KV value
KV_HEADERS = re.compile(r"blocks|peak used|preempt|KV|usage|knee|without preemption|pool|prefix hits", re.I)
KV_KEYS = {
    "preemptions",
    "peak_used_blocks",
    "server_preemptions",
    "server_peak_kv_usage",
    "server_mean_kv_usage",
    "server_output_tokens",
    "server_prefix_hit_rate",
    "num_gpu_blocks",
    "block_size",
    "pool_tokens",
    "num_slots",
    "slot_ctx_tokens",
    "knee",
    "measured_knee",
    "simulated_knee",
    "predicted_max_concurrency",
}


def markdown_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """Every Markdown table of ``text`` under its ``## `` title: a list of {header: cell}."""
    tables: dict[str, list[dict[str, str]]] = {}
    title, header = "", None
    for line in text.splitlines():
        if line.startswith("## "):
            title, header = line[3:], None
        elif line.startswith("|") and header is None:
            header = [c.strip() for c in line.strip("|").split("|")]
            tables[title] = []
        elif line.startswith("|---"):
            continue
        elif line.startswith("|") and header is not None:
            cells = [c.strip() for c in line.strip("|").split("|")]
            tables[title].append(dict(zip(header, cells)))
        else:
            header = None
    return tables


def kv_values(node, path=""):
    """(path, value) of every KV key anywhere in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in KV_KEYS and not isinstance(value, (dict, list)):
                yield f"{path}.{key}", value
            yield from kv_values(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from kv_values(value, f"{path}[{i}]")


def test_without_metrics_no_kv_cell_or_key_reads_0(tmp_path, fake):
    """transformers serve's case: no /metrics. Every KV cell of summary.md says unavailable (or has
    no estimate), none is 0 or empty; the engine-only table and chart are left out; the JSON has
    null, never 0, in every KV key, while the latencies it did measure are there."""
    server = fake(metrics=False, owned_by="huggingface")
    run_dir = tmp_path / "run"
    code, _, err = run_cli(
        "loadtest", str(workload(tmp_path)), "--target", server.url, "--out", str(run_dir), "--quiet"
    )
    assert code == 0, err
    text = (run_dir / "summary.md").read_text()
    tables = markdown_tables(text)
    assert "KV cache per level" not in tables and "kv_estimate_vs_measured.png" not in text
    assert {"Knee: predicted max concurrency against measured", "Server (remote target)"} <= set(tables)
    checked = 0
    for title, rows in tables.items():
        for row in rows:
            for header, cell in row.items():
                if KV_HEADERS.search(header) and header not in ("quantity",):
                    assert cell not in ("0", "", "0%", "0.0%"), f"{title}: {header} = {cell!r}"
                    checked += 1
    assert checked >= 3 * 4 + 4  # the server table's four KV columns at 3 levels, the knee table's cells
    server_rows = tables["Server (remote target)"]
    assert [r["server preemptions"] for r in server_rows] == ["unavailable"] * 3
    assert {r["server peak KV"] for r in server_rows} == {"unavailable"}
    knee = tables["Knee: predicted max concurrency against measured"][0]
    assert knee["knee of the target levels"] == "unavailable (no preemption counter)"
    pool = {r["quantity"]: r["server"] for r in tables["KV pool: kvplan's estimate against the server"]}
    assert pool["KV pool tokens"] == "unavailable" and pool["KV pool blocks"] == "unavailable"

    code, out, err = run_cli("report", str(run_dir), "--json")
    assert code == 0, err
    doc = json.loads(out)
    found = dict(kv_values(doc))
    assert found and all(v is None for v in found.values()), {k: v for k, v in found.items() if v is not None}
    assert len([k for k in found if k.endswith("server_peak_kv_usage")]) == 3
    level = doc["buckets"][0]["levels"][0]
    assert level["ttft_ms"]["p50"] > 0 and level["num_completed"] == 8 and level["ttfo_ms"] is None
    assert level["client"]["lag_p99_ms"] is not None and level["client"]["workers"] == 1


def test_sglang_pool_comes_from_cache_config_info_and_usage_from_the_full_attention_gauge(tmp_path, fake):
    """SGLang with cache_config_info (12 pages of 16 tokens) and full_token_usage: the pool is
    192 tokens from the pages, the usage 0.25 from full_token_usage (not token_usage's 0.5, the
    Mamba pool's), retractions counted per level (8 served per level)."""
    server = fake(flavor="sglang", owned_by="sglang", interval_s=0.002)
    run_dir = tmp_path / "run"
    code, _, err = run_cli(
        "loadtest", str(workload(tmp_path)), "--target", server.url, "--out", str(run_dir), "--quiet"
    )
    assert code == 0, err
    s = load_run(run_dir).result.server
    assert (s.num_gpu_blocks, s.block_size, s.pool_tokens, s.pool_source) == (12, 16, 192, "sglang:cache_config_info")
    assert (s.kv_usage_metric, s.kv_usage_note) == ("sglang:full_token_usage", None)
    levels = load_run(run_dir).result.levels
    assert [lv.server_peak_kv_usage for lv in levels] == [0.25] * 3
    assert [lv.server_preemptions for lv in levels] == [8, 8, 8]
    assert [lv.server_output_tokens for lv in levels] == [8 * 12] * 3  # 8 requests x 12 tokens each


def test_sglang_token_usage_of_a_hybrid_model_is_not_called_kv_usage(tmp_path, fake):
    """An SGLang without cache_config_info or full_token_usage, serving a Mamba hybrid (kvplan
    knows granite-4.0-h-micro's layers): the pool comes from max_total_num_tokens, and the usage
    column is named token_usage, not KV, with the reason in the note."""
    server = fake(flavor="sglang-old", owned_by="sglang", interval_s=0.002)
    run_dir = tmp_path / "run"
    code, out, err = run_cli(
        "loadtest",
        str(workload(tmp_path)),
        "--target",
        server.url,
        "--model",
        "granite-4.0-h-micro",
        "--out",
        str(run_dir),
        "--quiet",
    )
    assert code == 0, err
    s = load_run(run_dir).result.server
    assert (s.pool_tokens, s.block_size, s.pool_source) == (200, 1, "sglang:max_total_num_tokens")
    assert s.kv_usage_metric == "sglang:token_usage" and "not KV cache usage" in s.kv_usage_note
    server_rows = markdown_tables((run_dir / "summary.md").read_text())["Server (remote target)"]
    assert server_rows[0]["server peak token_usage (not KV: hybrid model)"] == "50.0%"
    assert "server peak KV" not in server_rows[0]
    # the same server and a model that is not hybrid: token_usage is KV usage there
    code, _, err = run_cli(
        "loadtest",
        str(workload(tmp_path)),
        "--target",
        server.url,
        "--model",
        "llama-3.1-8b",
        "--out",
        str(tmp_path / "r2"),
        "--quiet",
    )
    assert code == 0, err
    assert load_run(tmp_path / "r2").result.server.kv_usage_note is None


def word_tokenizer(tmp_path, size: int = 512):
    """A word-level tokenizer.json of ``size`` words w0 .. w{size-1}, split on spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_ttfo_is_the_first_answer_chunk_beside_ttft_and_null_without_reasoning(tmp_path, fake):
    """Chat streams whose first 4 chunks (after a role-only one) carry reasoning_content: TTFT ends
    at the first reasoning chunk, TTFO at the fifth chunk, per request and per level; the same run
    without reasoning leaves TTFO null (JSON, CSV) and the TTFO columns out of summary.md."""
    server = fake(interval_s=0.004, reasoning_chunks=4, role_chunk=True, usage=True)
    path = workload(tmp_path, api="chat", tokenizer=str(word_tokenizer(tmp_path)))
    run_dir = tmp_path / "run"
    code, _, err = run_cli("loadtest", str(path), "--target", server.url, "--out", str(run_dir), "--quiet")
    assert code == 0, err
    data = load_run(run_dir)
    for r in data.requests:
        assert r.first_output_time == r.token_times[4]  # one token per chunk: the fifth token is the answer's first
        assert r.first_output_time > r.token_times[0]
    level = data.result.levels[0]
    ttfo = sorted((r.first_output_time - r.arrival_time) * 1e3 for r in data.requests if r.key == level.key)
    assert level.ttfo_ms.count == 8 and level.ttfo_ms.p50 == pytest.approx((ttfo[3] + ttfo[4]) / 2)
    assert level.ttfo_ms.p50 > level.ttft_ms.p50
    doc = json.loads(run_cli("report", str(run_dir), "--json")[1])
    assert doc["buckets"][0]["levels"][0]["ttfo_ms"]["p50"] == pytest.approx(level.ttfo_ms.p50)
    latency = markdown_tables((run_dir / "summary.md").read_text())["Latency (ms, completed requests)"]
    assert list(latency[0])[6:9] == ["TTFO P50 ms", "TTFO P95 ms", "TTFO P99 ms"]
    csv_header = (run_dir / "requests.csv").read_text().splitlines()[0].split(",")
    assert "ttfo_ms" in csv_header and "first_output_time" in csv_header

    plain = fake(interval_s=0.002)
    code, _, err = run_cli("loadtest", str(path), "--target", plain.url, "--out", str(tmp_path / "plain"), "--quiet")
    assert code == 0, err
    data = load_run(tmp_path / "plain")
    assert all(r.first_output_time is None for r in data.requests)
    assert all(lv.ttfo_ms is None for lv in data.result.levels)
    assert "TTFO" not in (tmp_path / "plain" / "summary.md").read_text().split("## Metric definitions")[0]


@pytest.mark.parametrize(
    ("engine", "vocab", "source"),
    [
        ({"model": "tiny-random-llama"}, 512, "tiny-random-llama's vocabulary (engine.model)"),
        ({"model": "SmolLM2-135M-Instruct"}, 49152, "SmolLM2-135M-Instruct's vocabulary (engine.model)"),
    ],
)
def test_random_prompts_take_the_vocabulary_of_the_model_the_engine_section_names(
    tmp_path, fake, engine, vocab, source
):
    """No target.vocab_size: the engine section's model gives it (SmolLM2: 49,152; the tiny
    model: 512), and every prompt token id lies in [0, vocab)."""
    server = fake(interval_s=0.001)
    path = workload(tmp_path)
    doc = yaml.safe_load(path.read_text())
    del doc["target"]["vocab_size"]
    doc["engine"] = engine
    doc["buckets"][0].update({"concurrency": [1], "request_rates": [], "input_tokens": [200, 256]})
    path.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    code, out, err = run_cli("loadtest", str(path), "--target", server.url, "--out", str(run_dir))
    assert code == 0, err
    assert f"random token ids from [0, {vocab:,}): {source}" in out
    s = load_run(run_dir).result.server
    assert (s.vocab_size, s.vocab_source) == (vocab, source)
    ids = [i for body in server.bodies for i in body["prompt"]]
    assert 0 <= min(ids) and max(ids) < vocab and (vocab < 1000 or max(ids) >= 512)


def test_without_any_vocabulary_random_prompts_ask_for_vocab_size_in_one_line(tmp_path, fake):
    server = fake()
    path = workload(tmp_path)
    doc = yaml.safe_load(path.read_text())
    del doc["target"]["vocab_size"]
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run_cli("loadtest", str(path), "--target", server.url, "--out", str(tmp_path / "run"))
    assert code == 2 and err.count("\n") == 1 and "target.vocab_size: is needed for random prompts" in err, err
    assert not (tmp_path / "run").exists()
