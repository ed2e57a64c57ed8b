"""A GPU the engine never ran on: ``kvplan simulate --model M --gpu G`` and the workload's ``plan:`` entries.

The model and the KV pool are replaced: the pool is kvplan's capacity arithmetic on that GPU
(GPU memory x utilization - weights / tp - overhead, in blocks of the engine section's block
size; kvplan.plan.capacity), and each step is timed by the roofline of kvplan.plan.step_cost with
the efficiencies fitted to public serving results. The scheduler limits (block size,
max_num_seqs, max_num_batched_tokens, max_model_len, prefix caching) stay the engine section's.
Prompts are the workload's own, tokenised by the engine section's model.
"""

from __future__ import annotations

from kvplan.errors import KvplanError
from kvplan.load.sim.cost import ModelClock
from kvplan.load.sim.run import SimSetup
from kvplan.load.workload import Workload
from kvplan.plan import dtypes
from kvplan.plan.capacity import estimate_capacity
from kvplan.plan.gpu_perf import lookup_gpu_perf, serving_fit
from kvplan.plan.model_source import load_model_config
from kvplan.plan.model_spec import ModelSpec
from kvplan.plan.step_cost import roofline
from kvplan.results.run_result import EngineFacts
from kvplan.results.simulated import CostModelInfo


def gpu_setup(
    workload: Workload,
    model: str,
    gpu: str,
    tp: int = 1,
    kv_cache_dtype: str = "auto",
    weight_dtype: str = "auto",
    gpu_memory_utilization: float | None = None,
    target: str = "engine",
    fit=None,
) -> SimSetup:
    """Simulate ``model`` on ``tp`` GPUs ``gpu`` under the workload's scheduler limits.

    fit: efficiencies and overhead (kvplan.plan.gpu_perf.ServingFit); default the fitted ones.

    Raises:
        KvplanError: an unknown model or GPU, a GPU without FLOP/s and bandwidth figures (``gpu``),
            a bad tp or dtype, or a model that leaves no KV budget on that GPU.
    """
    if tp < 1:
        raise KvplanError("tp", f"must be >= 1 (got {tp})")
    perf = lookup_gpu_perf(gpu)
    config, name = load_model_config(workload.resolve_model(model))[:2]
    spec = ModelSpec.from_hf_config(config, name)
    settings = workload.engine
    capacity = estimate_capacity(
        spec,
        kv_cache_dtype=kv_cache_dtype,
        tp=tp,
        gpu=gpu,
        weight_dtype=weight_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        block_size=settings.block_size,
        max_model_len=settings.max_model_len,
    )
    cost = roofline(spec, perf, fit or serving_fit(), tp, kv_cache_dtype, weight_dtype)
    facts = EngineFacts(
        model=name,
        device=f"{capacity.gpu} x{tp}" if tp > 1 else str(capacity.gpu),
        dtype=dtypes.serving_dtype(spec.dtype),
        kv_cache_dtype=dtypes.canonical(capacity.kv_cache_dtype),
        attention_backend="roofline",
        block_size=settings.block_size,
        num_blocks=capacity.num_blocks,
        bytes_per_block=capacity.bytes_per_token_all_ranks * settings.block_size,
        max_model_len=capacity.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enable_prefix_caching=settings.enable_prefix_caching,
        seed=workload.seed,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        vocab_size=spec.vocab_size,
        hf_config=config,
    )
    info = CostModelInfo(
        kind="gpu",
        source=perf.source,
        description=f"roofline of {perf.name} x{tp}: {perf.bf16_flops / 1e12:g} TFLOPS bf16, "
        f"{perf.hbm_bytes_per_s / 1e9:g} GB/s, compute efficiency {cost.fit.compute_efficiency:.2f}, "
        f"memory efficiency {cost.fit.memory_efficiency:.2f}, {cost.fit.step_overhead_s * 1e3:.2f} ms "
        "per step",
        parameters={
            "gpu": perf.name,
            "tp": tp,
            "compute_efficiency": cost.fit.compute_efficiency,
            "memory_efficiency": cost.fit.memory_efficiency,
            "step_overhead_s": cost.fit.step_overhead_s,
            "num_blocks": capacity.num_blocks,
            "weights_bytes_per_rank": capacity.weights_bytes,
        },
    )
    return SimSetup(facts, lambda: ModelClock(cost), info, target=target, gpu=perf.name, tp=tp)


def plan_setups(workload: Workload) -> tuple[list[SimSetup], list[str]]:
    """A setup per ``plan:`` entry whose GPU has speed figures, and one note per entry skipped.

    Raises:
        KvplanError: a plan entry kvplan cannot size (unknown model, no KV budget), named ``plan[i]``.
    """
    setups, notes = [], []
    for i, entry in enumerate(workload.plan):
        try:
            lookup_gpu_perf(entry.gpu)
        except KvplanError as err:
            notes.append(f"plan[{i}]: {err.problem}; no capacity answers for it")
            continue
        try:
            setups.append(
                gpu_setup(workload, entry.model, entry.gpu, entry.tp, entry.kv_cache_dtype, target=f"plan[{i}]")
            )
        except KvplanError as err:
            raise err.within(source=workload.source, prefix=f"plan[{i}]") from None
    return setups, notes
