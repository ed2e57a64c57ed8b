"""``kvplan advise``'s host and disk offload alternatives: their figures are ``kvplan simulate`` of the
workload with that tier added, and the verdict's reason and its no-return rule (hand-made outcomes)."""

import json

import pytest
import yaml

from kvplan.optimize.advise import Alternative, BucketAdvice, alternatives, verdict
from kvplan.optimize.advise_offload import offload_changes
from kvplan.results.run_result import read_result
from kvplan.results.stats.offload import OffloadSummary
from kvplan.workload.file import parse_workload
from tests.kvplan.cli_runner import run_cli

# multi-turn sessions on a 24-block pool: turn k's history is evicted between turns, so a tier catches it
SESSIONS = {
    "name": "tiny_sessions",
    "seed": 0,
    "engine": {
        "model": "tiny-random-llama",
        "dtype": "float32",
        "block_size": 4,
        "num_blocks": 24,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "enable_prefix_caching": True,
    },
    "dataset": {"kind": "random", "sessions": {"max_turns": 3, "think_time_s": [0.05, 0.1]}},
    "slo": {"ttft_ms": 500, "tpot_ms": 100},
    "buckets": [{"name": "chat", "input_tokens": [8, 16], "output_tokens": 8, "concurrency": [4], "num_requests": 8}],
}


def summary(stores: int, loads: int, hits: int, device: int = 100) -> OffloadSummary:
    return OffloadSummary(
        device_hit_tokens=device,
        num_host_hit_tokens=hits,
        num_disk_hit_tokens=0,
        num_host_stores=stores,
        num_disk_stores=0,
        num_host_loads=loads,
        num_disk_loads=0,
        offload_bytes_stored=stores * 10,
        offload_bytes_loaded=loads * 10,
        peak_host_blocks=stores,
        peak_disk_blocks=0,
    )


def bucket(rate: float, offload: OffloadSummary | None = None) -> BucketAdvice:
    return BucketAdvice(
        name="b",
        max_users=None,
        max_request_rate=rate,
        goodput_at_max=None,
        level="c=4",
        goodput=None,
        requests_per_s=None,
        ttft_p50_ms=None,
        prefix_hit_rate=None,
        offload=offload,
    )


def test_the_tiers_are_sized_from_the_pool_and_offered_with_prefix_caching_only():
    workload = parse_workload(SESSIONS)
    # engine.config.TINY_LLAMA: 2 layers, 2 KV heads of 64 / 4 = 16 dims; fp32, 4-token blocks:
    # 2 (K, V) x 2 x 4 x 2 x 16 x 4 bytes = 2,048 bytes a block; 24 blocks = 49,152 bytes = 4.58e-5 GiB
    pool = 24 * 2048
    changes = {name: (update["offload"], removes) for name, _, update, removes in offload_changes(workload, pool)}
    # 4 x 49,152 B = 1.83e-4 GiB and 16 x = 7.32e-4 GiB, each rounded up to two significant digits
    assert set(changes) == {"host offload 0.00019 GiB", "disk offload 0.00074 GiB"}
    host, removes = changes["host offload 0.00019 GiB"]
    assert (host.host_gib, host.disk_gib, removes) == (0.00019, None, False)
    disk, _ = changes["disk offload 0.00074 GiB"]
    assert disk.host_gib is None and disk.disk_gib == 0.00074 and disk.disk_path
    off = parse_workload({**SESSIONS, "engine": {**SESSIONS["engine"], "enable_prefix_caching": False}})
    assert offload_changes(off, pool) == []
    assert not [a for a in alternatives(workload, False, "auto") if a.tier]  # no pool given: none
    has = parse_workload({**SESSIONS, "engine": {**SESSIONS["engine"], "offload": {"host_gib": 1}}})
    named = {a.name: a for a in alternatives(has, False, "auto", pool)}
    assert named["host offload 1 GiB"].removes and named["host offload 1 GiB"].engine["offload"].host_gib is None


def test_the_reason_says_what_came_back_and_nothing_back_is_not_worth_it():
    host = Alternative("host offload 1 GiB", "", {}, tier="host")
    said, why = verdict(host, [bucket(10.0)], [bucket(12.0, summary(stores=200, loads=50, hits=800, device=200))])
    assert said == "worth it"  # +20 %
    assert "b: 200 blocks evicted into the host tier, 50 loaded back (25%), 800 prefix-hit tokens from it" in why
    assert "(80% of prefix hits)" in why and "b max req/s 10 -> 12 (+20%)" in why
    # 1 of 200 stored blocks came back (0.5 %): not worth it, though the rate moved up
    said, why = verdict(host, [bucket(10.0)], [bucket(12.0, summary(stores=200, loads=1, hits=16))])
    assert said == "not worth it" and why.startswith("only 0.5% of the blocks evicted into it came back")
    said, why = verdict(host, [bucket(10.0)], [bucket(10.0, None)])
    assert said == "not worth it" and why.startswith("no block was evicted into it")
    # a tier the workload has, simulated away: its figures are the workload's own
    away = Alternative("host offload 1 GiB", "", {}, removes=True, tier="host")
    said, why = verdict(away, [bucket(12.0, summary(200, 100, 1600))], [bucket(10.0)])
    assert said == "worth it" and "100 loaded back (50%)" in why


def test_the_host_offload_figures_are_the_simulation_with_that_tier(tmp_path):
    source = tmp_path / "sessions.yaml"
    source.write_text(yaml.safe_dump(SESSIONS))
    code, out, err = run_cli("advise", str(source), "--json")
    assert code == 0, err
    rows = {a["name"]: a for a in json.loads(out)["alternatives"]}
    row = rows["host offload 0.00019 GiB"]
    edited = {**SESSIONS, "engine": {**SESSIONS["engine"], "offload": {"host_gib": 0.00019}}}
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(edited))
    code, _, err = run_cli("simulate", str(path), "--out", str(tmp_path / "run"), "--quiet")
    assert code == 0, err
    result = read_result(tmp_path / "run")
    assert result.engine.offload_host_blocks == int(0.00019 * 2**30) // result.engine.bytes_per_block == 99
    cap = result.capacity[0].buckets[0]
    mine = row["buckets"][0]
    assert mine["max_request_rate"] == (cap.max_request_rate.level if cap.max_request_rate else None)
    top = next(lv for lv in result.levels if lv.mode == "closed" and lv.level == 4)
    assert mine["goodput"] == pytest.approx(top.goodput_rps)
    assert mine["ttft_p50_ms"] == pytest.approx(top.ttft_ms.p50)
    assert top.offload is not None and mine["offload"] == top.offload.model_dump()
    assert top.offload.num_host_loads > 0  # the sessions' evicted history came back from the tier
    loads, stores = top.offload.num_host_loads, top.offload.num_host_stores
    assert (
        f"{stores:,} blocks evicted into the host tier, {loads:,} loaded back ({loads / stores:.0%})" in row["reason"]
    )
    assert row["verdict"] in ("worth it", "within noise", "not worth it")
