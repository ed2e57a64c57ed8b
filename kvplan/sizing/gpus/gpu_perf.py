"""GPU speeds (peak FLOP/s, memory and link bandwidth) and the serving efficiencies fitted to them.

``data/gpu_perf.yaml`` holds, per GPU of the GPU table (``data/gpus.yaml``, names resolved by
:func:`kvplan.sizing.gpus.gpus.lookup_gpu`), the datasheet figures with their sources, the
aiconfigurator-core system that is the same GPU (``silicon_system``, for measured step times:
kvplan.sizing.gpus.silicon), and ``serving_fit``: the compute and memory efficiencies and the per-step
overhead that kvplan.sizing.gpus.step_cost's roofline was fitted with (bench/gpu_cost_fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.sizing.gpus.gpus import lookup_gpu

GPU_PERF_FILE = Path(__file__).parents[1] / "data" / "gpu_perf.yaml"


@dataclass(frozen=True)
class GpuPerf:
    """One GPU's peak dense tensor FLOP/s, memory and GPU-to-GPU bandwidth, and where the figures
    come from.

    bf16_flops, fp8_flops, fp4_flops: FLOP/s, dense (never the "with sparsity" figure);
    ``fp8_flops`` None: no FP8 tensor cores; ``fp4_flops`` None: no FP4 (NVFP4 / MXFP4) tensor
    cores (every GPU before Blackwell).
    hbm_bytes_per_s, link_bytes_per_s: bytes/s, the link per direction.
    silicon_system: the aiconfigurator-core 0.12.0 system name (its ``systems/<name>.yaml``,
    e.g. ``h100_sxm``) that is this GPU; None where aiconfigurator has none.
    """

    name: str
    bf16_flops: float
    fp8_flops: float | None
    hbm_bytes_per_s: float
    link_bytes_per_s: float
    source: str
    fp4_flops: float | None = None
    silicon_system: str | None = None


@dataclass(frozen=True)
class ServingFit:
    """Fractions of peak FLOP/s and bandwidth a serving engine reaches, and its fixed cost per step
    (kernel launches, scheduling, sampling), fitted to public measured results (``fitted_on``)."""

    compute_efficiency: float
    memory_efficiency: float
    step_overhead_s: float
    fitted_on: str = ""


@lru_cache(maxsize=1)
def _table() -> dict:
    from kvplan.yaml_input import load_data

    return load_data(GPU_PERF_FILE.read_text())


def lookup_gpu_perf(name: str) -> GpuPerf:
    """The speeds of GPU ``name`` (any name :func:`lookup_gpu` resolves), from
    ``data/gpu_perf.yaml`` (TFLOP/s and GB/s there, FLOP/s and bytes/s here).

    Raises:
        KvplanError: ``gpu``: an unknown GPU, or one the table holds no FLOP/s and bandwidth for.
    """
    data = _table()
    known = ", ".join(sorted(data["gpus"]))
    try:
        table_name, _ = lookup_gpu(name)
    except KvplanError as err:
        raise KvplanError("gpu", err.problem, f"use one of {known}") from None
    if table_name not in data["gpus"]:  # keyed by the GPU table's canonical names
        raise KvplanError(
            "gpu",
            f"no FLOP/s or bandwidth figures for {table_name}",
            f"use one of {known} (kvplan/sizing/data/gpu_perf.yaml)",
        )
    key, entry = table_name, data["gpus"][table_name]
    fp8, fp4 = entry.get("fp8_tflops"), entry.get("fp4_tflops")
    system = entry.get("silicon_system")
    return GpuPerf(
        key,
        entry["bf16_tflops"] * 1e12,
        fp8 * 1e12 if fp8 else None,
        entry["hbm_gbps"] * 1e9,
        entry["link_gbps"] * 1e9,
        entry["source"],
        fp4_flops=fp4 * 1e12 if fp4 else None,
        silicon_system=str(system) if system else None,
    )


def serving_fit() -> ServingFit:
    """The fitted efficiencies and overhead of ``data/gpu_perf.yaml``."""
    fit = _table()["serving_fit"]
    return ServingFit(
        fit["compute_efficiency"],
        fit["memory_efficiency"],
        fit["step_overhead_ms"] / 1e3,
        str(fit.get("fitted_on", "")),
    )
