"""`kvplan loadtest` of the bundled engine with a host offload tier (engine.offload): the report's
hit-by-tier table agrees with the request records and with the tier rules (docs/architecture.md,
KV offload tiers), and the uncached variant (a salt per request) gets no hit from any tier.

The workload: 4 shared prefixes of 32 tokens (8 full blocks each) in front of 8-token prompts, a
pool of 24 blocks of 4 tokens (3 prefixes' blocks at most), so prefixes are evicted to the host
tier (128 blocks of 2,048 bytes: 0.25 MiB) and loaded back.
"""

from __future__ import annotations

import csv

import pytest

from kvplan.results.run_result import load_run
from tests.kvplan.cli_runner import run_cli

BLOCK_SIZE, BLOCK_BYTES = (
    4,
    2 * 2 * 4 * 2 * 16 * 4,
)  # tiny fp32: K and V x 2 layers x 4 tokens x 2 heads x 16 dims x 4 B
WORKLOAD = """\
name: offload_smoke
seed: 0
engine:
  model: tiny-random-llama
  dtype: float32
  block_size: 4
  num_blocks: 24
  max_num_seqs: 4
  offload: {host_gib: 0.000244140625}
dataset: random
shared_prefix: {num_tokens: 32, num_prefixes: 4}
buckets:
  - {name: short, input_tokens: 8, output_tokens: 4, concurrency: [2], num_requests: 16}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("offload")
    (root / "w.yaml").write_text(WORKLOAD)
    code, _, err = run_cli("loadtest", str(root / "w.yaml"), "--out", str(root / "run"), "--quiet")
    assert (code, err) == (0, ""), err
    return load_run(root / "run")


def test_hits_by_tier_agree_with_the_request_records(run):
    cached, uncached = run.result.levels
    assert (cached.variant, uncached.variant) == ("cached", "uncached")
    o = cached.offload
    assert o is not None and o.num_host_hit_tokens > 0 and o.num_disk_hit_tokens == 0
    # the requests' own cached tokens are every tier's hits together
    own = sum(r.num_cached_tokens for r in run.requests if r.variant == "cached")
    assert o.device_hit_tokens + o.num_host_hit_tokens == own
    assert o.num_host_hit_tokens == o.num_host_loads * BLOCK_SIZE  # a load is one full block
    assert o.offload_bytes_loaded == o.num_host_loads * BLOCK_BYTES
    assert o.offload_bytes_stored == o.num_host_stores * BLOCK_BYTES
    assert o.peak_host_blocks <= 128  # the tier's capacity: 0.25 MiB / 2,048 bytes
    # a salt per request: nothing anyone stored serves another request, from the pool or the host
    u = uncached.offload
    assert u is not None and u.num_host_stores > 0
    assert (u.device_hit_tokens, u.num_host_hit_tokens, u.num_host_loads) == (0, 0, 0)
    assert sum(r.num_cached_tokens for r in run.requests if r.variant == "uncached") == 0


def test_the_summary_and_steps_csv_show_the_tiers(run):
    o = run.result.levels[0].offload
    summary = (run.run_dir / "summary.md").read_text()
    assert "## KV offload tiers: prefix hits by tier" in summary
    row = f"| short | c=2 cached | {o.device_hit_tokens} | {o.num_host_hit_tokens} | 0 | {o.num_host_stores} | 0 |"
    assert row in summary
    assert "![offload_hits_by_tier.png](offload_hits_by_tier.png)" in summary
    assert (run.run_dir / "offload_hits_by_tier.png").stat().st_size > 0
    with open(run.run_dir / "steps.csv") as f:
        steps = list(csv.DictReader(f))
    assert sum(int(s["num_host_loads"]) for s in steps if s["variant"] == "cached") == o.num_host_loads


def test_simulate_has_the_tiers_in_the_targets_blocks(tmp_path):
    """The simulator's tiers (docs/simulate.md, KV offload tiers): 0.25 MiB holds 128 of the tiny
    model's blocks but not one of Llama-3.1-8B's (131,072 B a token x 4 = 512 KiB); 1 GiB holds 2,048."""
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    args = ("--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--quiet")
    code, _, err = run_cli("simulate", str(tmp_path / "w.yaml"), *args, "--out", str(tmp_path / "small"))
    assert code == 2 and "engine.offload.host_gib: must hold at least one KV block of 524,288 bytes" in err
    (tmp_path / "w.yaml").write_text(WORKLOAD.replace("host_gib: 0.000244140625", "host_gib: 1"))
    code, _, err = run_cli("simulate", str(tmp_path / "w.yaml"), *args, "--out", str(tmp_path / "run"))
    assert (code, err) == (0, "")
    run = load_run(tmp_path / "run")
    assert (run.result.engine.offload_host_blocks, run.result.engine.bytes_per_block) == (2_048, 524_288)
    assert "## KV offload tiers: prefix hits by tier" in (tmp_path / "run" / "summary.md").read_text()
