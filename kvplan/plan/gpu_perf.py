"""GPU speeds (peak FLOP/s, memory and link bandwidth) and the serving efficiencies fitted to them.

``data/gpu_perf.yaml`` holds, per GPU of the GPU table (``data/gpus.yaml``, names resolved by
:func:`kvplan.plan.gpus.lookup_gpu`), the datasheet figures with their sources, and
``serving_fit``: the compute and memory efficiencies and the per-step overhead that
kvplan.plan.step_cost's roofline was fitted with (bench/gpu_cost_fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.plan.gpus import lookup_gpu

GPU_PERF_FILE = Path(__file__).parent / "data" / "gpu_perf.yaml"


@dataclass(frozen=True)
class GpuPerf:
    """One GPU's peak dense tensor FLOP/s (``fp8_flops`` None: no FP8 tensor cores), memory and
    GPU-to-GPU bandwidth (bytes/s, per direction), and where the figures come from."""

    name: str
    bf16_flops: float
    fp8_flops: float | None
    hbm_bytes_per_s: float
    link_bytes_per_s: float
    source: str


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
    import yaml

    return yaml.safe_load(GPU_PERF_FILE.read_text())


def lookup_gpu_perf(name: str) -> GpuPerf:
    """The speeds of GPU ``name`` (any name :func:`lookup_gpu` resolves).

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
            f"use one of {known} (kvplan/plan/data/gpu_perf.yaml)",
        )
    key, entry = table_name, data["gpus"][table_name]
    fp8 = entry.get("fp8_tflops")
    return GpuPerf(
        key,
        entry["bf16_tflops"] * 1e12,
        fp8 * 1e12 if fp8 else None,
        entry["hbm_gbps"] * 1e9,
        entry["link_gbps"] * 1e9,
        entry["source"],
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
