"""KV offload tiers on a GPU target (``kvplan simulate --gpu``): the workload's engine.offload sized in
the target's own blocks (kvplan's bytes per block of the model on that GPU), and each step that
loads blocks back from the host tier lasting its roofline time + setup + bytes / bandwidth of the
GPU system's host link (H100 SXM: PCIe Gen5 x16, effective 50.3 GB/s a direction, 2 us setup)."""

import pytest

from kvplan.results.run_result import load_run
from kvplan.run.sim.cost import StepWork
from kvplan.run.sim.gpu_target import gpu_setup
from kvplan.run.sim.run import simulate
from kvplan.workload.file import parse_workload

# Llama-3.1-8B bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 B = 131,072 B a token; 16 a block
BLOCK_BYTES = 131_072 * 16


def workload(host_gib):
    """8 prefixes of 2,048 tokens (128 blocks each) in front of short prompts, 2 users: on a pool of a
    few hundred blocks the prefixes evict each other, and come back."""
    engine = {"model": "tiny-random-llama", "max_model_len": 4096}
    if host_gib is not None:
        engine["offload"] = {"host_gib": host_gib}
    return parse_workload(
        {
            "name": "offload-gpu",
            "engine": engine,
            "dataset": {"kind": "random"},
            "shared_prefix": {"num_tokens": 2048, "num_prefixes": 8},
            "buckets": [{"name": "b", "input_tokens": 64, "output_tokens": 4, "concurrency": [2], "num_requests": 48}],
        }
    )


def setup_of(w):
    # a memory utilization that leaves the 8B model's weights (16 GB) a KV pool of 439 blocks
    return gpu_setup(w, "llama-3.1-8b", "H100-SXM", gpu_memory_utilization=0.225, step_times="roofline")


def test_the_tiers_are_sized_in_the_targets_blocks():
    setup = setup_of(workload(1.5))
    assert setup.facts.bytes_per_block == BLOCK_BYTES
    assert setup.facts.offload_host_blocks == int(1.5 * 2**30) // BLOCK_BYTES == 768
    assert setup.facts.offload_disk_blocks == 0
    assert "pcie5-effective (50.3 GB/s, 2 us setup)" in setup.cost_model.description
    assert setup_of(workload(None)).facts.offload_host_blocks == 0


def test_host_loads_lengthen_their_steps_by_the_link_price(tmp_path):
    w = workload(1.5)
    setup = setup_of(w)
    assert setup.facts.num_blocks == 439 < 8 * 128  # the prefixes cannot all stay on the GPU
    run = load_run(simulate(w, setup, tmp_path / "run", search=False))
    cost = setup.clock().cost  # the roofline alone
    loads = [s for s in run.steps if s.num_host_loads]
    assert loads and sum(s.num_host_hit_tokens for s in run.steps) == 16 * sum(s.num_host_loads for s in loads)
    for s in run.steps:
        roofline = cost.step_seconds(StepWork.of(s))
        price = 2e-6 + s.num_host_loads * BLOCK_BYTES / 50.3e9 if s.num_host_loads else 0.0
        assert s.end_time - s.start_time == pytest.approx(roofline + price, rel=1e-9), s.step_index
    # a whole 2,048-token prefix back from host memory: 128 blocks, 256 MiB over PCIe Gen5: 5.339 ms
    whole = [s for s in loads if s.num_host_loads == 128]
    assert whole and 2e-6 + 128 * BLOCK_BYTES / 50.3e9 == pytest.approx(5.3387e-3, abs=1e-7)
