"""KV offload tiers (engine.offload) through the whole engine on the tiny random Llama (fp32, block_size 4).

One tiny block = 2 (K, V) x 2 layers x 4 tokens x 2 KV heads x 16 head_dim x 4 bytes = 2,048 bytes.
The scenario (a pool of 6 blocks)::

    A: 17-token prompt, 3 outputs -> 19 tokens computed, blocks 0-3 full and cached, block 4 not
    B: 21-token prompt, 3 outputs -> needs all 6 blocks: evicts A's 4 cached ones (4 stores)
    A again: its 4 blocks (16 tokens; the cap is (17 - 1) // 4 = 4) miss the pool, hit a lower
       tier: 4 loads, 1 prompt token computed instead of 17; the take of 5 blocks (4 loads + 1 new)
       evicts B's block 5 (never cached: 3 tokens) then B's cached blocks 4, 3, 2, 1 (4 stores)

The greedy tokens are compared with the same engine without offload (a recompute) and with
transformers' greedy generate.
"""

from __future__ import annotations

import gc
import os

import pytest

from engine.config import GIB, SettingError
from engine.offload.tiers import Offload
from engine.request import SamplingParams
from tests.engine.tiny import hf_greedy, random_prompts, tiny_engine, tiny_hf_model

BLOCK_BYTES = 2 * 2 * 4 * 2 * 16 * 4  # 2,048
PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)
A, B = random_prompts([17, 21], seed=3)


def gib(blocks: int) -> float:
    """A tier of exactly ``blocks`` tiny blocks, in GiB (exact in binary floating point)."""
    return blocks * BLOCK_BYTES / GIB


def run_one_by_one(engine, prompts, salts=None):
    """Each prompt alone to the end, in order; (outputs, every step's stats per request)."""
    outputs, stats = [], []
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, PARAMS, request_id=str(i), cache_salt=salts[i] if salts else None)
        mine = []
        while engine.has_unfinished():
            out, s = engine.step()
            outputs += out
            mine.append(s)
        stats.append(mine)
    return outputs, stats


def total(stats, field):
    return sum(getattr(s, field) for s in stats)


@pytest.fixture(scope="module")
def reference():
    hf = tiny_hf_model()
    return {tuple(p): hf_greedy(hf, p, 3, ignore_eos=True) for p in (A, B)}


@pytest.mark.parametrize(
    "tiers, tier",
    [
        ({"offload_host_gib": gib(8)}, "host"),
        ({"offload_disk_gib": gib(8), "offload_disk_path": "TMP"}, "disk"),
    ],
)
def test_an_evicted_block_comes_back_from_a_lower_tier_with_the_same_tokens(tiers, tier, reference, tmp_path):
    tiers = {k: str(tmp_path) if v == "TMP" else v for k, v in tiers.items()}
    plain, plain_stats = run_one_by_one(tiny_engine(num_blocks=6), [A, B, A])
    engine = tiny_engine(num_blocks=6, **tiers)
    tiered, stats = run_one_by_one(engine, [A, B, A])
    expected = [reference[tuple(p)] for p in (A, B, A)]
    assert [list(o.output_token_ids) for o in plain] == expected  # recompute (no offload)
    assert [list(o.output_token_ids) for o in tiered] == expected  # loaded back from the tier
    other = "disk" if tier == "host" else "host"
    # B's admission evicts A's 4 cached blocks into the tier
    assert total(stats[1], f"num_{tier}_stores") == 4 and total(stats[1], "offload_bytes_stored") == 4 * BLOCK_BYTES
    admit = stats[2][0]  # A again: 4 blocks loaded, 16 tokens served by the tier, 1 computed
    assert (admit.num_prefill_tokens, admit.num_prefix_hit_tokens) == (1, 16)
    assert (getattr(admit, f"num_{tier}_loads"), getattr(admit, f"num_{tier}_hit_tokens")) == (4, 16)
    assert admit.offload_bytes_loaded == 4 * BLOCK_BYTES
    assert getattr(admit, f"num_{tier}_stores") == 4  # B's cached blocks 4..1 evicted by the take
    assert getattr(admit, f"num_{tier}_blocks") == 8 and getattr(admit, f"num_{other}_blocks") == 0
    assert tiered[2].num_cached_tokens == 16 and plain[2].num_cached_tokens == 0
    # 16 prompt tokens fewer computed than the recompute, nothing else different
    assert total(plain_stats[2], "num_prefill_tokens") - total(stats[2], "num_prefill_tokens") == 16
    engine.scheduler.block_manager.offload.check()


FIELDS = (
    "num_prefill_tokens",
    "num_prefix_hit_tokens",
    "num_host_stores",
    "num_disk_stores",
    "num_host_loads",
    "num_disk_loads",
    "num_host_hit_tokens",
    "num_disk_hit_tokens",
    "num_host_blocks",
    "num_disk_blocks",
)


def admissions(stats):
    """FIELDS of each request's first step (the one that admits it)."""
    return [tuple(getattr(mine[0], f) for f in FIELDS) for mine in stats]


def test_host_evictions_cascade_to_disk(reference, tmp_path):
    """Host of 4 blocks over disk of 8, requests A, B, A, B, A one after another. By hand (block
    ids of the pool; the free queue: never-used first, then the freed ones, a table's tail first):
    B's take evicts A's 4 (host holds A3 A2 A1 A0). A again touches them (A0 least recent) and
    takes blocks 0 (B's uncached tail), then B4 B3 B2 B1: each store to the full host pushes one
    of A's down to disk (4 + 4 stores). B again: B0 still in the pool (block 5), B1-B4 from host
    (20 tokens hit, 16 of them host); its take stores A3-A0 to host, pushing B1-B4 to disk (8
    there). A a third time: from host again; its take stores B4-B1 to host, pushing A0-A3 out of
    host to disk, which holds them already: touched, nothing stored."""
    engine = tiny_engine(
        num_blocks=6, offload_host_gib=gib(4), offload_disk_gib=gib(8), offload_disk_path=str(tmp_path)
    )
    outputs, stats = run_one_by_one(engine, [A, B, A, B, A])
    assert [list(o.output_token_ids) for o in outputs] == [reference[tuple(p)] for p in (A, B, A, B, A)]
    assert admissions(stats) == [
        (17, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        (21, 0, 4, 0, 0, 0, 0, 0, 4, 0),
        (1, 16, 4, 4, 4, 0, 16, 0, 4, 4),
        (1, 20, 4, 4, 4, 0, 16, 0, 4, 8),
        (1, 16, 4, 0, 4, 0, 16, 0, 4, 8),
    ]
    engine.scheduler.block_manager.offload.check()


def test_salted_blocks_never_cross_salts_in_any_tier(reference, tmp_path):
    """Tenants x and y send the same prompt A under their own salts, B (no salt) between them;
    host of 4 over disk of 16. By hand as above: B evicts x's A to host; y's A finds nothing of
    x's (0 hit, 17 computed) while x's sit on host, and its take pushes them to disk; B again
    hits its own (20); x's A again loads x's own 4 from disk, y's A its own 4 from disk; tenant z
    finds nothing though x's and y's blocks are on host and disk."""
    engine = tiny_engine(
        num_blocks=6, offload_host_gib=gib(4), offload_disk_gib=gib(16), offload_disk_path=str(tmp_path)
    )
    salts = ["x", None, "y", None, "x", "y", "z"]
    outputs, stats = run_one_by_one(engine, [A, B, A, B, A, A, A], salts)
    assert admissions(stats) == [
        (17, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        (21, 0, 4, 0, 0, 0, 0, 0, 4, 0),
        (17, 0, 4, 4, 0, 0, 0, 0, 4, 4),  # y: x's blocks are on host, and serve nobody else
        (1, 20, 4, 4, 4, 0, 16, 0, 4, 8),
        (1, 16, 4, 4, 0, 4, 0, 16, 4, 12),  # x: its own, from disk
        (1, 16, 4, 0, 0, 4, 0, 16, 4, 12),  # y: its own, from disk
        (17, 0, 4, 1, 0, 0, 0, 0, 4, 13),  # z: nothing
    ]
    assert [o.num_cached_tokens for o in outputs] == [0, 0, 0, 20, 16, 16, 0]
    assert {o.output_token_ids for o in outputs if o.prompt_token_ids == tuple(A)} == {tuple(reference[tuple(A)])}
    engine.scheduler.block_manager.offload.check()


def test_no_block_leaks_after_cancels_and_preemptions(tmp_path):
    """Eight requests at once on a pool of 10 blocks (preemptions), two aborted mid-run; then
    the first four again with four new ones (lookups that hit the tiers), one of them aborted.
    Afterwards the pool is all free, every tier's slots are either free or held by exactly one
    entry, and every finished request's tokens equal those of the engine without offload."""
    first = random_prompts([13, 17, 9, 21, 15, 11, 19, 7], seed=11)
    second = first[:4] + random_prompts([10, 14, 18, 6], seed=12)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    results = {}
    for tiers in ({}, {"offload_host_gib": gib(3), "offload_disk_gib": gib(5), "offload_disk_path": str(tmp_path)}):
        engine = tiny_engine(num_blocks=10, max_num_seqs=4, **tiers)
        done, preemptions = {}, 0
        for phase, (prompts, aborted) in enumerate(((first, ("1", "6")), (second, ("p1-5",)))):
            for i, p in enumerate(prompts):
                engine.add_request(p, params, request_id=f"p{phase}-{i}")
            step = 0
            while engine.has_unfinished():
                out, s = engine.step()
                done.update((o.request_id, o) for o in out)
                preemptions += s.num_preemptions
                step += 1
                if step == 3:
                    for request_id in aborted:
                        engine.abort(f"p{phase}-{request_id}" if "-" not in request_id else request_id)
        bm = engine.scheduler.block_manager
        assert bm.num_used_blocks == 0 and bm.num_free_blocks == 10
        assert preemptions > 0 and sum(o.finish_reason == "abort" for o in done.values()) == 3
        if bm.offload is not None:
            bm.offload.check()
            assert bm.offload.totals["num_host_stores"] > 0 and bm.offload.totals["num_disk_stores"] > 0
            assert bm.offload.totals["num_host_loads"] + bm.offload.totals["num_disk_loads"] > 0
        results[bool(tiers)] = {r: o.output_token_ids for r, o in done.items() if o.finish_reason == "length"}
    assert results[True] == results[False] and len(results[True]) == 13


def test_the_disk_file_is_written_for_real_and_removed_with_the_engine(tmp_path):
    engine = tiny_engine(num_blocks=6, offload_disk_gib=gib(8), offload_disk_path=str(tmp_path))
    (path,) = tmp_path.iterdir()
    assert path.stat().st_size == 8 * BLOCK_BYTES  # reserved at start
    run_one_by_one(engine, [A, B])
    assert any(path.read_bytes())  # A's 4 blocks were written to slots 0-3
    del engine
    gc.collect()
    assert not list(tmp_path.iterdir())


def test_bad_tiers_are_one_line_at_construction(tmp_path):
    with pytest.raises(SettingError, match=r"^offload_host_gib: must hold at least one KV block of 2,048 bytes"):
        tiny_engine(num_blocks=6, offload_host_gib=gib(1) / 2)
    with pytest.raises(SettingError, match=r"^offload_disk_path: must be an existing directory"):
        tiny_engine(num_blocks=6, offload_disk_gib=gib(4), offload_disk_path=str(tmp_path / "absent"))
    with pytest.raises(SettingError, match=r"^offload_disk_path: cannot create a file in /proc"):
        tiny_engine(num_blocks=6, offload_disk_gib=gib(4), offload_disk_path="/proc")
    free_gib = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize / GIB
    with pytest.raises(SettingError, match=r"^offload_disk_gib: needs .* bytes but .* free; lower it"):
        tiny_engine(num_blocks=6, offload_disk_gib=free_gib * 2 + 1, offload_disk_path=str(tmp_path))
    with pytest.raises(SettingError, match=r"^enable_prefix_caching: offload tiers need it on"):
        tiny_engine(num_blocks=6, offload_host_gib=gib(4), enable_prefix_caching=False)
    with pytest.raises(SettingError, match=r"^offload_disk_path: a disk tier needs a directory"):
        tiny_engine(num_blocks=6, offload_disk_gib=gib(4))
    assert not list(tmp_path.iterdir())  # no file left by a failed start


def test_tier_bookkeeping_cascades_lru_without_a_mover():
    """The policy alone (what a simulation runs): host of 2 over disk of 2, hashes a..e."""
    off = Offload(2, 2, bytes_per_block=100, block_size=4)
    for block_id, h in enumerate([b"a", b"b", b"c"]):
        off.evicted(block_id, h)  # c pushes a (LRU) to disk
    assert list(off.by_name["host"].entries) == [b"b", b"c"] and list(off.by_name["disk"].entries) == [b"a"]
    off.read_sources([(b"b", "host")])  # a load touches b: c is now least recently used
    off.evicted(9, b"d")  # pushes c down
    off.evicted(9, b"b")  # already on host: a touch, no store
    off.evicted(9, b"e")  # pushes d down; disk full: a (LRU) is dropped
    assert list(off.by_name["host"].entries) == [b"b", b"e"]
    assert list(off.by_name["disk"].entries) == [b"c", b"d"]
    assert off.tier_of(b"a") is None and off.tier_of(b"c") == "disk" and off.tier_of(b"b") == "host"
    columns = off.step_columns()
    assert (columns["num_host_stores"], columns["num_disk_stores"]) == (5, 3)  # a b c d e; a c d
    assert columns["offload_bytes_stored"] == 800 and (columns["num_host_blocks"], columns["num_disk_blocks"]) == (2, 2)
    assert off.step_columns()["num_host_stores"] == 0  # counters are per step
    off.check()


@pytest.mark.parametrize("kv_dtype", ["fp8", "bfloat16", "float32"])
def test_a_loaded_block_holds_the_bytes_it_was_evicted_with(kv_dtype, tmp_path):
    """Every KV dtype moves as bytes: A's 4 cached blocks, read from the pool before B evicts
    them, are byte for byte the blocks A's second request loads back (host tier, then disk)."""
    for tiers in ({"offload_host_gib": gib(8)}, {"offload_disk_gib": gib(8), "offload_disk_path": str(tmp_path)}):
        engine = tiny_engine(num_blocks=6, kv_cache_dtype=kv_dtype, **tiers)
        bm = engine.scheduler.block_manager
        mover = bm.offload.mover
        run_one_by_one(engine, [A])
        before = {h: mover._device_block(b).clone() for h, b in bm._cached.items()}
        assert len(before) == 4
        outputs, stats = run_one_by_one(engine, [B, A])
        assert stats[1][0].num_prefix_hit_tokens == 16
        for h, data in before.items():
            assert mover._device_block(bm._cached[h]).equal(data)
        del engine
