"""Workload YAML: the shipped files load, and every bad file gives one line naming the field."""

import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.workload import load_workload, parse_workload
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]
BAD = Path(__file__).resolve().parent / "bad_workloads"

# file -> the YAML path and problem its one-line error must name.
BAD_CASES = {
    "missing_field.yaml": "buckets[0].num_requests: required field missing",
    "wrong_type.yaml": "buckets[0].concurrency: must be a list (got 'four')",
    "negative_concurrency.yaml": "buckets[1].concurrency[1]: must be >= 1 (got -1)",
    "empty_buckets.yaml": "buckets: must not be empty",
    "unknown_dataset.yaml": "dataset.kind: must be one of 'sharegpt', 'random', 'jsonl' (got 'wikipedia')",
    "unreadable_dataset.yaml": "dataset.path: file not found:",
    "bad_units.yaml": "engine.kv_cache_memory: unknown unit; use B, KB, MB, GB, KiB, MiB or GiB (e.g. 48MiB) (got '48 parsecs')",
    "malformed.yaml": "malformed YAML: line 6, column 18: expected ',' or ']', but got ':'",
    "unknown_field.yaml": "buckets[0].concurency: unknown field",
    "both_pool_sizes.yaml": "engine: give kv_cache_memory or num_blocks, not both",
    "inverted_range.yaml": "buckets[0].input_tokens: min must be <= max (got min 256, max 16)",
    "no_levels.yaml": "buckets[0]: give concurrency levels and/or request_rates",
    "not_a_mapping.yaml": "must be a YAML mapping (got list)",
    "sharegpt_without_tokenizer.yaml": "dataset: sharegpt needs a tokenizer and tiny-random-llama has none",
    "bad_dtype.yaml": "engine.dtype: must be one of 'auto', 'bfloat16', 'float16', 'float32' (got 'float64')",
    "duplicate_bucket.yaml": "buckets[1].name: duplicate name 'short'",
    "normal_without_std.yaml": "buckets[0].input_tokens: dist normal needs std (tokens)",
    "zero_rate.yaml": "buckets[0].request_rates[1]: must be > 0",
}


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_bad_workload_is_one_line_naming_the_field(name):
    path = BAD / name
    with pytest.raises(KvplanError) as caught:
        load_workload(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert BAD_CASES[name] in message
    assert "\n" not in message


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_kvplan_loadtest_on_a_bad_workload_exits_2_with_one_line(name, tmp_path):
    path = BAD / name
    code, out, err = run_cli("loadtest", str(path), "--out", str(tmp_path / "run"))
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and BAD_CASES[name] in lines[0]
    assert not (tmp_path / "run").exists()


def test_the_installed_command_prints_no_traceback():
    code = "from kvplan.cli import main; main()"
    missing = BAD / "missing_field.yaml"
    done = subprocess.run([sys.executable, "-c", code, "loadtest", str(missing)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {missing}: buckets[0].num_requests: required field missing"
    assert "Traceback" not in done.stderr + done.stdout


def test_missing_workload_file():
    with pytest.raises(KvplanError, match=r"nope.yaml: cannot read workload file \(No such file or directory\)"):
        load_workload(BAD / "nope.yaml")


@pytest.mark.parametrize("name", ["smoke.yaml", "chat.yaml", "long_context.yaml"])
def test_shipped_workloads_load(name):
    workload = load_workload(ROOT / "workloads" / name)
    assert workload.name == name.removesuffix(".yaml")
    assert len(workload.sha256) == 64
    assert all(b.concurrency or b.request_rates for b in workload.buckets)


def test_shorthands_and_units():
    w = parse_workload({
        "name": "w", "dataset": "random",
        "engine": {"kv_cache_memory": "1.5GiB", "block_size": 8},
        "buckets": [{"name": "a", "input_tokens": 128, "output_tokens": [16, 64], "concurrency": [1, 8],
                     "num_requests": 2}],
    })
    assert w.engine.kv_cache_memory == 1.5 * 2**30
    assert parse_workload({**w.model_dump(), "engine": {"kv_cache_memory": "48MiB"}}).engine.kv_cache_memory == 48 * 2**20
    bucket = w.buckets[0]
    assert (bucket.input_tokens.min, bucket.input_tokens.max, bucket.input_tokens.dist) == (128, 128, "fixed")
    assert (bucket.output_tokens.min, bucket.output_tokens.max, bucket.output_tokens.dist) == (16, 64, "uniform")
    config = w.engine.to_engine_config(seed=5)
    assert (config.kv_cache_memory_bytes, config.block_size, config.seed) == (1.5 * 2**30, 8, 5)
