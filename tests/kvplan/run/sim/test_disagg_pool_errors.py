"""An ``engine.disagg`` pool's own KV pool size that cannot serve: the one line names the pool's
setting (``engine.disagg.decode.num_blocks``), not only the engine section's it replaced, which
the user did not set to that value (kvplan.run.sim.setups._pool_setup, kvplan.run.checks)."""

from pathlib import Path

import pytest
import yaml

from tests.kvplan.cli_runner import run_cli

SMOKE = Path(__file__).resolve().parents[4] / "workloads" / "smoke.yaml"


@pytest.mark.parametrize(
    ("pools", "line"),
    [
        # a tiny-random-llama float32 block of 4 tokens: 2 x 2 layers x 4 x 4 kv heads x 8 dims x 4 bytes
        # = 2,048 bytes (once named engine.kv_cache_memory, which the workload does not set)
        (
            {"prefill": {"workers": 1, "kv_cache_memory": "1KiB"}, "decode": {"workers": 1}},
            "engine.disagg.prefill.kv_cache_memory: 1,024 bytes hold not one block of 2,048 bytes",
        ),
        # smoke's shortest request: 12 + 12 tokens = ceil(23 / 4) = 6 blocks; the decode pool has 2
        # (once: "grow engine.num_blocks", whose 48 blocks were enough)
        (
            {"prefill": {"workers": 1}, "decode": {"workers": 1, "num_blocks": 2}},
            "buckets[0].input_tokens: the shortest request (12 + 12 tokens) needs 6 blocks of 4 tokens, the KV"
            " pool has 2; lower it or grow engine.num_blocks or engine.disagg.decode.num_blocks",
        ),
    ],
)
def test_a_pool_too_small_is_named_as_the_pool_s_setting(tmp_path, pools, line):
    data = yaml.safe_load(SMOKE.read_text())
    data["engine"]["disagg"] = pools
    data.pop("plan")
    path = tmp_path / "disagg.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "sim"))
    assert code == 2 and not (tmp_path / "sim").exists(), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and line in lines[0], err
