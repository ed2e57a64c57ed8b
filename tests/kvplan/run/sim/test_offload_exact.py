"""The simulator with KV offload tiers (engine.offload) replays a tiered bundled run exactly: a
measured load test of the tiny random model with a host and a disk tier, and its simulation timed by
the run's own step times (kvplan.run.sim.replay), agree at every step on the scheduling (the
exactness test's fields) and on the tiers: blocks each tier holds, stores, loads and hit tokens by
tier, bytes moved; and on each level's hit-by-tier summary (LevelSummary.offload).

Two shapes whose prefixes come back after eviction, with tiers small enough that both evict
(blocks of 4 tokens: 2 x 2 layers x 4 tokens x 2 KV heads x 16 dims x 4 B = 2,048 bytes; host
1.1444091796875e-05 GiB = 12,288 B = 6 blocks, disk 1.9073486328125e-05 GiB = 20,480 B = 10 blocks):

- multi-turn sessions (each turn's prompt is the previous turn's prompt and reply), 3 users on a
  16-block pool, closed loop with no think time (clock-independent: the replay is exact whatever
  the machine's load);
- 5 shared prefixes of 32 tokens (8 blocks each) and 2 tenants on a 24-block pool, closed and open
  loop, cached and uncached (a salt per request) variants.
"""

import pytest

from kvplan.results.run_result import load_run
from kvplan.run.loadtest import run_loadtest
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import replay_setup
from kvplan.workload.file import load_workload
from tests.kvplan.run.sim.test_exactness import SAME, by_level

ENGINE = """\
engine:
  model: tiny-random-llama
  dtype: float32
  block_size: 4
  num_blocks: {num_blocks}
  max_num_seqs: 4
  max_num_batched_tokens: 24
  enable_prefix_caching: true
  offload: {{host_gib: 1.1444091796875e-05, disk_gib: 1.9073486328125e-05, disk_path: "{disk}"}}
"""
SESSIONS = """\
name: offload_sessions
seed: 0
{engine}dataset: {{kind: random, sessions: {{max_turns: 3, think_time_s: 0}}}}
buckets:
  - {{name: chat, input_tokens: [8, 16], output_tokens: [4, 8], concurrency: [3], num_requests: 8}}
"""
PREFIXES = """\
name: offload_prefixes
seed: 0
{engine}dataset: random
shared_prefix: {{num_tokens: 32, num_prefixes: 5, num_tenants: 2}}
buckets:
  - name: mix
    input_tokens: [4, 12]
    output_tokens: [3, 8]
    concurrency: [3]
    request_rates: [150]
    num_requests: 16
"""
HOST_BLOCKS, DISK_BLOCKS, BLOCK_BYTES = 12_288 // 2_048, 20_480 // 2_048, 2_048
TIERS = (
    "num_host_blocks",
    "num_disk_blocks",
    "num_host_stores",
    "num_disk_stores",
    "num_host_loads",
    "num_disk_loads",
    "num_host_hit_tokens",
    "num_disk_hit_tokens",
    "offload_bytes_stored",
    "offload_bytes_loaded",
)


@pytest.fixture(scope="module", params=[("sessions", SESSIONS, 16), ("prefixes", PREFIXES, 24)], ids=lambda p: p[0])
def runs(request, tmp_path_factory):
    """(workload, measured run, its replayed simulation) of one shape."""
    name, text, num_blocks = request.param
    root = tmp_path_factory.mktemp(name)
    (root / "w.yaml").write_text(text.format(engine=ENGINE.format(num_blocks=num_blocks, disk=root)))
    workload = load_workload(root / "w.yaml")
    measured = load_run(run_loadtest(workload, root / "measured"))
    simulated = load_run(simulate(workload, replay_setup(workload, measured.run_dir), root / "sim"))
    return workload, measured, simulated


def test_the_runs_exercise_both_tiers(runs):
    _, measured, simulated = runs
    steps = measured.steps
    for field in ("num_host_stores", "num_disk_stores", "num_host_loads", "num_disk_loads"):
        assert sum(getattr(s, field) for s in steps) > 0, field
    # both tiers fill up, so both evict (host -> disk, disk drops)
    assert max(s.num_host_blocks for s in steps) == HOST_BLOCKS
    assert max(s.num_disk_blocks for s in steps) == DISK_BLOCKS
    assert sum(s.num_disk_stores for s in steps) > DISK_BLOCKS
    # the simulated engine's tiers: int(gib x 2**30) // bytes_per_block, as the engine sized its own
    for run in (measured, simulated):
        engine = run.result.engine
        assert (engine.offload_host_blocks, engine.offload_disk_blocks, engine.bytes_per_block) == (
            HOST_BLOCKS,
            DISK_BLOCKS,
            BLOCK_BYTES,
        )


def test_the_simulation_equals_the_tiered_run_at_every_step(runs):
    _, measured, simulated = runs
    assert simulated.result.source == "simulated" and simulated.result.cost_model.kind == "replay"
    mine, theirs = by_level(simulated.steps), by_level(measured.steps)
    assert list(mine) == list(theirs)
    for key, steps in theirs.items():
        assert len(mine[key]) == len(steps), key
        for a, b in zip(mine[key], steps):
            for field in SAME + TIERS:
                assert getattr(a, field) == getattr(b, field), (key, b.step_index, field)
            assert a.offload_bytes_loaded == (a.num_host_loads + a.num_disk_loads) * BLOCK_BYTES
            assert a.num_disk_hit_tokens == a.num_disk_loads * 4
    assert [lv.offload for lv in simulated.result.levels] == [lv.offload for lv in measured.result.levels]
    assert all(lv.offload is not None for lv in simulated.result.levels)

    def shape(rs):
        return sorted((r.request_id, r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens) for r in rs)

    assert shape(simulated.requests) == shape(measured.requests)


def test_the_simulated_report_has_the_hit_by_tier_table(runs):
    _, measured, simulated = runs
    ours = (simulated.run_dir / "summary.md").read_text()
    theirs = (measured.run_dir / "summary.md").read_text()
    assert "## KV offload tiers: prefix hits by tier" in ours

    def table(text: str) -> list[str]:
        section = text.split("## KV offload tiers: prefix hits by tier")[1].split("\n## ")[0]
        return [line for line in section.splitlines() if line.startswith("| ")]

    assert table(ours) == table(theirs) and len(table(ours)) == 1 + len(simulated.result.levels)


def test_offload_without_room_for_one_block_is_named(tmp_path):
    from kvplan.errors import KvplanError
    from kvplan.run.sim.facts import simulated_facts

    text = SESSIONS.format(engine=ENGINE.format(num_blocks=16, disk=tmp_path)).replace("1.1444091796875e-05", "1e-06")
    (tmp_path / "w.yaml").write_text(text)
    with pytest.raises(KvplanError) as err:
        simulated_facts(load_workload(tmp_path / "w.yaml"), "cpu", "torch")
    assert err.value.field == "engine.offload.host_gib"
    assert "2,048 bytes" in err.value.problem


def test_the_calibrated_clock_prices_loads_by_this_machines_fitted_copies(tmp_path):
    """Under the shipped CPU calibration a step's loads cost this machine's fitted copies
    (links.yaml cpu-host-load and cpu-disk-read, bench/offload_copy_fit.py): the step's calibrated
    time + the disk leg + the host leg (kvplan.sizing.gpus.offload.TierLinks)."""
    from kvplan.run.sim.cost import StepWork
    from kvplan.run.sim.setups import engine_setup
    from kvplan.sizing.gpus.links import lookup_link

    (tmp_path / "w.yaml").write_text(SESSIONS.format(engine=ENGINE.format(num_blocks=16, disk=tmp_path)))
    workload = load_workload(tmp_path / "w.yaml")
    setup = engine_setup(workload)[0]
    assert "cpu-host-load" in setup.cost_model.description
    run = load_run(simulate(workload, setup, tmp_path / "sim", search=False))
    host, disk = lookup_link("cpu-host-load"), lookup_link("cpu-disk-read")
    cost = setup.clock().cost
    loaded = [s for s in run.steps if s.num_host_loads or s.num_disk_loads]
    assert any(s.num_disk_loads for s in loaded)
    for s in run.steps:
        extra = 0.0
        if s.num_disk_loads:
            extra += disk.setup_s + s.num_disk_loads * BLOCK_BYTES / disk.bytes_per_s
        if s.num_host_loads or s.num_disk_loads:
            extra += host.setup_s + (s.num_host_loads + s.num_disk_loads) * BLOCK_BYTES / host.bytes_per_s
        assert s.end_time - s.start_time == pytest.approx(cost.step_seconds(StepWork.of(s)) + extra, rel=1e-9)
