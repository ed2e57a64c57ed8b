"""KV offload tiers in kvplan's arithmetic (kvplan.sizing.gpus.offload): tier capacity in blocks by
the engine's rule, and a step's loads priced as setup + bytes / bandwidth over each tier's link,
concurrent loads sharing the link; checked by hand and against kvplan.sizing.gpus.links.SharedLink.
Then on the simulator's clock: a step that loads blocks back lasts that much longer; a step that
only stores does not (stores are asynchronous)."""

import pytest

from kvplan.errors import KvplanError
from kvplan.results.records import LevelKey
from kvplan.run.driver import Level, run_level
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.cost import FixedStepCost, ModelClock, StepWork
from kvplan.sizing.gpus.gpus import gpu_table
from kvplan.sizing.gpus.links import Link, SharedLink, link_table
from kvplan.sizing.gpus.offload import TierLinks, tier_blocks, tier_links
from kvplan.traffic.requests import SampledRequest
from tests.kvplan.run.sim.test_decode_runs import _Capture, facts

MIB = 1_048_576
HOST = Link("host", 25e9, 10e-6)  # 25 GB/s, 10 us setup
DISK = Link("disk", 5e9, 100e-6)  # 5 GB/s, 100 us setup
LINKS = TierLinks(HOST, DISK, MIB)


def test_tier_capacity_is_the_engines_rule():
    # Llama-3.1-8B bf16: 2 x 32 layers x 8 KV heads x 128 dims x 2 B = 131,072 B a token; 16 a block = 2 MiB
    assert tier_blocks(4, 131_072 * 16) == 2_048
    assert tier_blocks(1.1444091796875e-05, 2_048) == 6  # 12,288 B of the tiny model's 2,048 B blocks
    assert tier_blocks(0.5, 3 * MIB) == 170  # 536,870,912 // 3,145,728 = 170.67, rounded down
    assert tier_blocks(None, 2_048) == 0
    with pytest.raises(ValueError):
        tier_blocks(1, 0)


def test_one_host_load_is_setup_plus_bytes_over_bandwidth():
    assert LINKS.load_seconds(1, 0) == pytest.approx(10e-6 + 1_048_576 / 25e9)  # 51.94 us
    assert LINKS.load_seconds(0, 0) == 0.0


def test_two_loads_in_one_step_share_the_link():
    # both start with the step: 10 us + 2 MiB / 25 GB/s = 93.89 us, not 2 x 51.94 us
    assert LINKS.load_seconds(2, 0) == pytest.approx(10e-6 + 2 * 1_048_576 / 25e9)
    assert LINKS.load_seconds(2, 0) == pytest.approx(93.886e-6, abs=1e-9)
    # the link model of kvplan.sizing.gpus.links says the same: two transfers started together
    link = SharedLink(HOST)
    link.start("a", 0.0, MIB)
    link.start("b", 0.0, MIB)
    assert link.next_end() == pytest.approx(LINKS.load_seconds(2, 0))


def test_a_disk_load_crosses_both_links():
    # disk -> host (100 us + 1 MiB / 5 GB/s), then host -> device with the host block (10 us + 2 MiB / 25 GB/s)
    expected = (100e-6 + 1_048_576 / 5e9) + (10e-6 + 2 * 1_048_576 / 25e9)
    assert LINKS.load_seconds(1, 1) == pytest.approx(expected)  # 403.6 us


def test_every_gpu_has_a_host_link_of_the_link_table():
    for name, entry in gpu_table().items():
        assert entry["host_link"] in link_table(), name
        assert tier_links(name, MIB).host.name == entry["host_link"]
    assert tier_links("GH200", MIB).host.bytes_per_s == 346e9  # NVLink-C2C, measured host-to-device
    assert tier_links("A100-80GB", MIB).host.bytes_per_s == 25.1e9  # PCIe Gen4 x16, measured
    # PCIe Gen5 x16: the line rate x the measured Gen4 efficiency (links.yaml)
    assert tier_links("H100-SXM", MIB).host.bytes_per_s == pytest.approx(63.0e9 * 25.13 / 31.5, rel=1e-3)
    assert tier_links("A100-80GB", MIB).disk.name == "nvme-gen4"
    with pytest.raises(KvplanError):
        tier_links("H100-SXM", MIB, disk="floppy")


def test_the_clock_adds_loads_not_stores():
    clock = ModelClock(FixedStepCost(0.01), links=LINKS)
    plain = StepWork(4, 0, 1, 4, 10)
    assert clock.step_end(1.0, plain) == pytest.approx(1.01)
    loaded = StepWork(4, 0, 1, 12, 10, num_host_loads=2)
    assert clock.step_end(1.0, loaded) == pytest.approx(1.01 + 10e-6 + 2 * MIB / 25e9)
    assert ModelClock(FixedStepCost(0.01)).step_end(1.0, loaded) == pytest.approx(1.01)  # no links: no price


def test_a_simulated_load_lengthens_its_admitting_step_only():
    """One request at a time on 12 blocks of 4 tokens, a host tier of 64 blocks of 1 MiB: A
    (20-token prompt, 20 out), B (8-token prompt, 30 out) whose decode evicts A's cached blocks to
    the host tier (stores: no time), then A's prompt again: 2 of its blocks load back from host
    (tests/kvplan/run/sim/test_decode_runs_offload.py). Every step lasts 10 ms but that one:
    10 ms + 10 us + 2 MiB / 25 GB/s."""
    engine = facts(4, 12, 4, 64, True).model_copy(update={"offload_host_blocks": 64, "bytes_per_block": MIB})
    a = tuple(range(1, 21))
    requests = (
        SampledRequest(a, 20, "random"),
        SampledRequest(tuple(range(100, 108)), 30, "random"),
        SampledRequest(a, 4, "random"),
    )
    level = Level(LevelKey("b", "closed", 1, ""), 0, requests, None)
    capture = _Capture(level)
    backend = SimBackend(engine, ModelClock(FixedStepCost(0.01), links=LINKS))
    run_level(backend, level, capture, seed=0)
    steps = capture.steps
    assert sum(s["num_host_stores"] for s in steps) == 10  # 7 while B decodes, 3 for A's fresh blocks
    (hit,) = [i for i, s in enumerate(steps) if s["num_host_loads"]]
    assert steps[hit]["num_host_loads"] == 2
    for i, s in enumerate(steps):
        extra = 10e-6 + 2 * MIB / 25e9 if i == hit else 0.0
        assert s["end_time"] - s["start_time"] == pytest.approx(0.01 + extra, abs=1e-12), i
