"""The roofline step-time model by hand: FLOPs, bytes and link traffic of a step of a tiny Llama
on a made-up GPU, and the GPU speed table's lookups and refusals."""

import pytest

from kvplan.errors import KvplanError
from kvplan.run.sim.cost import StepWork
from kvplan.sizing.gpus.gpu_perf import GpuPerf, ServingFit, lookup_gpu_perf, serving_fit
from kvplan.sizing.gpus.step_cost import ALLREDUCE_LATENCY_S, roofline
from kvplan.sizing.models.model_spec import ModelSpec

TINY = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# per layer: q and o 64 x 64 each, k and v 64 x 32 each, gate/up/down 64 x 128 each, 2 norms of 64
PER_LAYER = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
OTHER = 2 * PER_LAYER + 64  # + the final norm
EMBEDDING = 2 * 512 * 64  # untied input and output embeddings
GPU = GpuPerf("test", bf16_flops=1e12, fp8_flops=2e12, hbm_bytes_per_s=1e9, link_bytes_per_s=1e8, source="made up")
FIT = ServingFit(compute_efficiency=0.5, memory_efficiency=0.8, step_overhead_s=0.001)


def test_one_gpu_step_by_hand():
    cost = roofline(ModelSpec.from_hf_config(TINY, "tiny"), GPU, FIT)
    assert cost.flops_per_token == 2 * OTHER
    assert cost.weight_bytes == (OTHER + EMBEDDING) * 2
    assert cost.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2  # K and V x layers x KV heads x head_dim x bf16
    # 3 decoding requests with 10, 20 and 30 tokens of context, one 8-token prefill chunk after 4 cached
    work = StepWork(
        num_prefill_tokens=8,
        num_decode_tokens=3,
        num_prefill_seqs=1,
        num_context_tokens=10 + 20 + 30 + 12,
        num_attended_tokens=10 + 20 + 30 + 8 * 4 + 36,
    )
    flops = 2 * OTHER * 11 + 2 * 512 * 64 * 4 + 4 * 4 * 16 * 2 * work.num_attended_tokens
    moved = (OTHER + EMBEDDING) * 2 + 256 * (72 + 11) + 11 * 2 * (6 * 64 + 3 * 128) * 2
    parts = cost.parts(work)
    assert parts["compute_s"] == pytest.approx(flops / 1e12)
    assert parts["memory_s"] == pytest.approx(moved / 1e9)
    assert parts["link_s"] == 0
    assert cost.step_seconds(work) == pytest.approx(max(flops / 0.5e12, moved / 0.8e9) + 0.001)


def test_tensor_parallel_splits_the_work_and_pays_the_link():
    spec = ModelSpec.from_hf_config(TINY, "tiny")
    one, two = roofline(spec, GPU, FIT), roofline(spec, GPU, FIT, tp=2)
    assert two.flops_per_token == one.flops_per_token / 2 and two.weight_bytes == one.weight_bytes / 2
    assert two.kv_bytes_per_token == one.kv_bytes_per_token / 2  # one KV head of 2 per rank
    work = StepWork(0, 4, 0, 40, 40)
    # 2 layers x 2 all-reduces of 4 tokens x 64 x 2 bytes; a ring moves 2 x (2 - 1) / 2 of it per rank
    link = 2 * 2 * 4 * 64 * 2 * 2 * (2 - 1) / 2
    assert two.parts(work)["link_s"] == pytest.approx(link / 1e8 + 4 * ALLREDUCE_LATENCY_S)


def test_fp8_weights_run_at_the_fp8_peak():
    spec = ModelSpec.from_hf_config(TINY, "tiny")
    assert roofline(spec, GPU, FIT, weight_dtype="fp8").peak_flops == 2e12
    assert roofline(spec, GPU, FIT).peak_flops == 1e12
    no_fp8 = GpuPerf("old", 1e12, None, 1e9, 1e8, "made up")
    assert roofline(spec, no_fp8, FIT, weight_dtype="fp8").peak_flops == 1e12


def test_gpu_speeds_resolve_through_the_gpu_table():
    h100 = lookup_gpu_perf("h100 sxm")
    assert (h100.name, h100.bf16_flops, h100.hbm_bytes_per_s) == ("H100-SXM", 989.5e12, 3350e9)
    assert lookup_gpu_perf("H100-80GB") == h100  # the old name of the SXM part
    assert lookup_gpu_perf("a100-80gb").fp8_flops is None
    with pytest.raises(KvplanError, match="no FLOP/s or bandwidth figures for A10G"):
        lookup_gpu_perf("A10G")
    with pytest.raises(KvplanError, match="unknown GPU 'V100'"):
        lookup_gpu_perf("V100")
    fit = serving_fit()
    assert 0 < fit.compute_efficiency <= 1 and 0 < fit.memory_efficiency <= 1 and fit.step_overhead_s >= 0


# aiconfigurator-core 0.12.0 systems/<name>.yaml, by hand: its FLOP/s and bytes/s as written there
# (bfloat16_tc_flops, fp8_tc_flops, fp4_tc_flops, mem_bw, intra_node_bw), with kvplan's GPU name
AIC_SYSTEMS = {
    "gb200": ("GB200", 2_500e12, 5_000e12, 10_000e12, 8_000e9, 900e9),
    "b300_sxm": ("B300", 2_250e12, 4_500e12, 14_000e12, 7_750e9, 900e9),
    "gb300": ("GB300", 2_500e12, 5_000e12, 15_000e12, 8_000e9, 900e9),
    "rtx_pro_6000_server": (
        "RTX-PRO-6000-Server",
        467_800_534_963_698,
        935_601_069_927_397,
        1_871_202_139_854_795,
        1_792e9,
        64e9,
    ),
    "a30": ("A30", 165e12, None, None, 933e9, 32e9),
}


@pytest.mark.parametrize("system", sorted(AIC_SYSTEMS))
def test_gpus_added_from_aiconfigurator_carry_its_dense_figures(system):
    name, bf16, fp8, fp4, hbm, link = AIC_SYSTEMS[system]
    perf = lookup_gpu_perf(name)
    assert perf.name == name and perf.silicon_system == system
    # kvplan keeps a tenth of a TFLOP/s: 467.8 for 467.8005... (1.1e-6 off)
    assert perf.bf16_flops == pytest.approx(bf16, rel=1e-5)
    assert perf.fp8_flops == (None if fp8 is None else pytest.approx(fp8, rel=1e-5))
    assert perf.fp4_flops == (None if fp4 is None else pytest.approx(fp4, rel=1e-5))
    assert (perf.hbm_bytes_per_s, perf.link_bytes_per_s) == (hbm, link)
    assert f"aiconfigurator-core 0.12.0 systems/{system}.yaml" in perf.source


def test_the_intel_b60_runs_fp8_at_the_bf16_rate():
    # systems/b60.yaml: bfloat16_tc_flops 98304000000000; no native FP8 matrix compute; 456 GB/s;
    # no GPU-to-GPU link: PCIe 5.0 x8, 32 GB/s per direction
    b60 = lookup_gpu_perf("B60")
    assert (b60.name, b60.silicon_system) == ("Arc-Pro-B60", "b60")
    assert (b60.bf16_flops, b60.fp8_flops, b60.fp4_flops) == (pytest.approx(98_304e9), None, None)
    assert (b60.hbm_bytes_per_s, b60.link_bytes_per_s) == (456e9, 32e9)


@pytest.mark.parametrize(
    "gpu, system, fp4_tflops",
    [
        ("H100-SXM", "h100_sxm", None),
        ("h100-80gb", "h100_sxm", None),  # an alias resolves to the same entry
        ("H100-PCIe", "h100_pcie", None),
        ("H200", "h200_sxm", None),
        ("B200", "b200_sxm", 9000),  # HGX B200: FP4 18 PFLOPS with sparsity, halved
        ("A100-80GB", "a100_sxm", None),  # kvplan's A100-80GB speeds are the SXM part's
        ("L40S", "l40s", None),
        ("L4", "l4", None),
        ("A100-40GB", None, None),  # aiconfigurator's a100_sxm is the 80 GB part (2,039 GB/s)
        ("RTX-4090", None, None),
        ("MI300X", None, None),
    ],
)
def test_silicon_systems_name_the_same_gpu(gpu, system, fp4_tflops):
    perf = lookup_gpu_perf(gpu)
    assert perf.silicon_system == system
    assert perf.fp4_flops == (None if fp4_tflops is None else fp4_tflops * 1e12)


def test_made_up_gpus_default_to_no_fp4_and_no_silicon_system():
    assert (GPU.fp4_flops, GPU.silicon_system) == (None, None)


def test_silicon_systems_match_the_installed_aiconfigurator():
    """Every ``silicon_system`` is a system file of the installed aiconfigurator-core, and every
    system with a measured database is some kvplan GPU's (skipped without the ``silicon`` extra)."""
    from pathlib import Path

    import yaml

    from kvplan.sizing.gpus.gpu_perf import GPU_PERF_FILE

    aic = pytest.importorskip("aiconfigurator_core")
    systems = Path(aic.__file__).parent / "systems"
    entries = yaml.safe_load(GPU_PERF_FILE.read_text())["gpus"].values()
    named = {entry["silicon_system"] for entry in entries if "silicon_system" in entry}
    assert all((systems / f"{name}.yaml").is_file() for name in named), named
    # a system without a database has an empty data folder (a .gitkeep only)
    measured = {
        folder.name
        for folder in (systems / "data").iterdir()
        if folder.is_dir() and any(not f.name.startswith(".") for f in folder.iterdir())
    }
    assert measured <= named, measured - named
    for system, (_, bf16, fp8, fp4, hbm, link) in AIC_SYSTEMS.items():
        spec = yaml.safe_load((systems / f"{system}.yaml").read_text())
        assert spec["gpu"]["bfloat16_tc_flops"] == bf16 and spec["gpu"]["mem_bw"] == hbm, system
        assert spec["gpu"].get("fp8_tc_flops") == fp8 and spec["gpu"].get("fp4_tc_flops") == fp4, system
        assert spec["node"]["intra_node_bw"] == link, system
