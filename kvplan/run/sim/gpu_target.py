"""A GPU the engine never ran on: ``kvplan simulate --model M --gpu G`` and the workload's ``plan:`` entries.

The model and the KV pool are replaced: the pool is kvplan's capacity arithmetic on that GPU
(GPU memory x utilization - weights / tp - overhead, in blocks of the engine section's block
size; kvplan.sizing.capacity). Each step is timed from measured silicon where aiconfigurator-core's
database covers the GPU, backend and model (kvplan.sizing.gpus.silicon), else by the roofline of
kvplan.sizing.gpus.step_cost with the efficiencies fitted to public serving results; the setup's
``notes`` say why in one line. The scheduler limits (block size,
max_num_seqs, max_num_batched_tokens, max_model_len, prefix caching) stay the engine section's;
the way steps are formed is the backend's: SGLang computes prefill batches apart from decode
batches (its scheduler runs a prefill batch whenever a waiting request can be admitted, and mixes
decodes into it only with ``--enable-mixed-chunk``, off by default: sglang docs, "Server
Arguments"), so ``--backend sglang`` simulates with engine.config's ``prefill_first``; vLLM v1 and
TensorRT-LLM's in-flight batching mix decodes and prefill chunks in one step, as the engine does.
Prompts are the workload's own, tokenised by the engine section's model.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from kvplan.errors import KvplanError
from kvplan.results.run_result import EngineFacts
from kvplan.results.simulated import CostModelInfo
from kvplan.run.sim.cost import VLLM_TOKENIZE_US_PER_TOKEN, ModelClock, TextFrontEnd
from kvplan.run.sim.facts import offload_blocks
from kvplan.run.sim.setups import SimSetup
from kvplan.sizing import dtypes
from kvplan.sizing.capacity import GiB, estimate_capacity
from kvplan.sizing.gpus import data_parallel as dpar
from kvplan.sizing.gpus.data_parallel import check_ep
from kvplan.sizing.gpus.gpu_perf import lookup_gpu_perf, serving_fit
from kvplan.sizing.gpus.offload import tier_links
from kvplan.sizing.gpus.step_cost import roofline
from kvplan.sizing.models.model_source import load_model_config
from kvplan.sizing.models.model_spec import ModelSpec
from kvplan.workload.schema import Workload

PREFILL_FIRST_BACKENDS = ("sglang",)  # backends whose steps are prefill-only or decode-only (module docstring)
SGLANG_STEPS = "; prefill steps apart from decode steps, as SGLang schedules"


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
    backend: str = "vllm",
    backend_version: str | None = None,
    ep: int = 1,
    step_times: str = "auto",
    silicon_fit=None,
    dp: int = 1,
    moe_kernel: str = "auto",
    tokenize_us_per_token: float = 0.0,
) -> SimSetup:
    """Simulate ``model`` on ``tp`` GPUs ``gpu`` under the workload's scheduler limits; ``dp`` > 1:
    an instance of ``tp x dp`` GPUs with attention data parallel ``dp`` (kvplan.sizing.gpus.data_parallel:
    ``dp`` x the KV pool and the scheduler limits, each step the busiest rank's).

    fit: the roofline's efficiencies and overhead (kvplan.sizing.gpus.gpu_perf.ServingFit); default the
    fitted ones. backend / backend_version: whose measured database times the steps (default
    vLLM's newest). ep: expert-parallel size of a MoE model (experts split ``ep`` ways, each
    expert ``tp x dp / ep`` ways). step_times: ``auto`` (silicon where covered, else the roofline),
    ``silicon`` (an error where not covered) or ``roofline``. silicon_fit: the silicon model's
    correction (kvplan.sizing.gpus.silicon.SiliconFit); default the backend's fitted one.
    moe_kernel: ``auto`` or ``marlin`` (MXFP4 experts on Marlin, as ``VLLM_MXFP4_USE_MARLIN=1``
    runs them; silicon step times only: kvplan.sizing.gpus.silicon_marlin). tokenize_us_per_token:
    the server's tokenizer thread, us per prompt token, where its client sends text prompts
    (kvplan.run.sim.cost.TextFrontEnd; vLLM's: ``VLLM_TOKENIZE_US_PER_TOKEN``); 0: off.

    Raises:
        KvplanError: an unknown model or GPU, a GPU without FLOP/s and bandwidth figures (``gpu``),
            a bad tp, dp, ep or dtype, an unknown backend or backend version, a model that leaves no
            KV budget on that GPU, ``step_times: silicon`` on a target the database lacks, or a
            ``tokenize_us_per_token`` below 0 or not finite.
    """
    from kvplan.sizing.gpus import silicon, silicon_db

    front_end = text_front_end(tokenize_us_per_token)
    if tp < 1:
        raise KvplanError("tp", f"must be >= 1 (got {tp})")
    perf = lookup_gpu_perf(gpu)
    config, name = load_model_config(workload.resolve_model(model))[:2]
    spec = ModelSpec.from_hf_config(config, name)
    dpar.check_dp(spec, tp, dp)
    check_ep(spec, tp, ep, dp)
    settings = workload.engine
    rank_weights = dpar.rank_weights_bytes(spec, weight_dtype, tp, dp) / GiB if dp > 1 else None
    try:
        capacity = estimate_capacity(
            spec,
            kv_cache_dtype=kv_cache_dtype,
            tp=tp,
            gpu=gpu,
            weight_dtype=weight_dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            block_size=settings.block_size,
            max_model_len=settings.max_model_len,
            weights_gib=rank_weights,
        )
    except KvplanError as err:  # name what a simulation sets them by: the engine section, its own options
        if err.field in ("max_model_len", "block_size"):
            raise err.within(source=workload.source, prefix="engine") from None
        if err.field == "KV budget":
            raise KvplanError(
                err.field, err.problem, "use a larger `gpu`, more `tp`, or a smaller `weight_dtype`"
            ) from None
        raise
    num_blocks = None if capacity.num_blocks is None else capacity.num_blocks * dp  # dp ranks, a pool each
    backend = silicon.check_backend(backend)
    notes: tuple[str, ...] = ()
    timed: silicon.SiliconStepCost | str = "--step-times roofline"
    if step_times != "roofline":
        system = getattr(perf, "silicon_system", None)
        timed = silicon.silicon_cost(
            config, system, tp, backend, backend_version, weight_dtype, kv_cache_dtype, ep, silicon_fit, dp, moe_kernel
        )
        if isinstance(timed, str):
            if step_times == "silicon":
                raise KvplanError(
                    "step_times", f"no measured step times for {name} on {perf.name}: {timed}", "use auto"
                )
            notes = (f"{target}: {name} on {perf.name} timed by the roofline: {timed}",)
    elif backend_version is not None:
        raise KvplanError("backend_version", "applies to silicon step times only", "drop it, or use --step-times auto")
    roof = roofline(spec, perf, fit or serving_fit(), tp, kv_cache_dtype, weight_dtype, dp)
    block_bytes = capacity.bytes_per_token_all_ranks * settings.block_size
    facts = EngineFacts(
        model=name,
        device=(f"{capacity.gpu} x{tp * dp}" if tp * dp > 1 else str(capacity.gpu))
        + f" (tp {tp} x dp {dp})" * (dp > 1),
        dtype=dtypes.serving_dtype(spec.dtype),
        kv_cache_dtype=dtypes.canonical(capacity.kv_cache_dtype),
        attention_backend="roofline" if isinstance(timed, str) else timed.source.label,
        block_size=settings.block_size,
        num_blocks=num_blocks,
        bytes_per_block=block_bytes,
        max_model_len=capacity.max_model_len,
        max_num_seqs=settings.max_num_seqs * dp,
        max_num_batched_tokens=settings.max_num_batched_tokens * dp,
        enable_prefix_caching=settings.enable_prefix_caching,
        seed=workload.seed,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        vocab_size=spec.vocab_size,
        prefill_first=backend in PREFILL_FIRST_BACKENDS,
        hf_config=config,
        **offload_blocks(workload, block_bytes),  # the engine section's tiers, in this target's blocks
    )
    if isinstance(timed, str):
        cost: Any = roof
        info = CostModelInfo(
            kind="gpu",
            source=perf.source,
            step_times="roofline",
            description=f"roofline of {perf.name} x{tp}: {perf.bf16_flops / 1e12:g} TFLOPS bf16, "
            f"{perf.hbm_bytes_per_s / 1e9:g} GB/s, compute efficiency {roof.fit.compute_efficiency:.2f}, "
            f"memory efficiency {roof.fit.memory_efficiency:.2f}, {roof.fit.step_overhead_s * 1e3:.2f} ms "
            "per step" + (SGLANG_STEPS if facts.prefill_first else ""),
            parameters={
                "gpu": perf.name,
                "tp": tp,
                "dp": dp,
                "compute_efficiency": roof.fit.compute_efficiency,
                "memory_efficiency": roof.fit.memory_efficiency,
                "step_overhead_s": roof.fit.step_overhead_s,
                "num_blocks": num_blocks,
                "weights_bytes_per_rank": capacity.weights_bytes,
            },
        )
    else:
        cost, src = timed, timed.source
        info = CostModelInfo(
            kind="gpu",
            source=f"aiconfigurator-core {silicon_db.package_version()} measured database ({src.model_path})",
            step_times=src.label,
            description=f"measured operation times of {src.system} x{tp}"
            + (f" (expert parallel {ep})" if ep > 1 else "")
            + (f", attention data parallel {dp}" if dp > 1 else "")
            + (", MXFP4 experts on Marlin (silicon_marlin)" if moe_kernel == "marlin" else "")
            + f" under {src.backend} {src.version}, scales {timed.fit.decode_scale:.3f} (decode) and "
            f"{timed.fit.prefill_scale:.3f} (prefill), {timed.fit.step_overhead_s * 1e3:.2f} ms per step, "
            f"{timed.fit.layer_overhead_s * 1e3:.4f} ms per layer per step and "
            f"{timed.fit.seq_overhead_s * 1e3:.3f} ms per sequence" + (SGLANG_STEPS if facts.prefill_first else ""),
            parameters={
                "gpu": perf.name,
                "tp": tp,
                "ep": ep,
                "dp": dp,
                "system": src.system,
                "backend": src.backend,
                "backend_version": src.version,
                "model_path": src.model_path,
                "decode_scale": timed.fit.decode_scale,
                "prefill_scale": timed.fit.prefill_scale,
                "step_overhead_s": timed.fit.step_overhead_s,
                "seq_overhead_s": timed.fit.seq_overhead_s,
                "layer_overhead_s": timed.fit.layer_overhead_s,
                "num_layers": timed.num_layers,
                "num_blocks": num_blocks,
                "weights_bytes_per_rank": capacity.weights_bytes,
            },
        )
    if dp > 1:  # each step the busiest DP rank's (kvplan.sizing.gpus.data_parallel)
        cost = dpar.DataParallelStepCost(cost, dp)
    links = None
    if facts.offload_host_blocks or facts.offload_disk_blocks:  # loads priced over the system's links
        links = tier_links(perf.name, block_bytes)
        info = info.model_copy(update={"description": f"{info.description}; {links.describe()}"})
    if front_end is not None:
        info = info.model_copy(
            update={
                "description": f"{info.description}; text prompts tokenized on one thread, "
                f"{tokenize_us_per_token:g} us per prompt token after a {front_end.window_s * 1e3:g} ms wait",
                "parameters": {**info.parameters, "tokenize_us_per_token": tokenize_us_per_token},
            }
        )
    return SimSetup(
        facts,
        lambda: ModelClock(cost, links=links, front_end=front_end),
        info,
        target=target,
        gpu=perf.name,
        tp=tp,
        notes=notes,
        weight_dtype=dtypes.canonical_weight(weight_dtype),
        ep=ep,
        backend=backend,
        dp=dp,
    )


def text_front_end(us_per_token: float) -> TextFrontEnd | None:
    """The tokenizer thread of ``us_per_token`` us per prompt token (None for 0: off).

    Raises:
        KvplanError: a rate below 0 or not finite (``tokenize_us_per_token``).
    """
    if not math.isfinite(us_per_token) or us_per_token < 0:
        raise KvplanError(
            "tokenize_us_per_token",
            f"must be a finite number >= 0 (got {us_per_token})",
            f"give us per prompt token, such as {VLLM_TOKENIZE_US_PER_TOKEN} (vLLM's, measured), or 0 for none",
        )
    return TextFrontEnd(us_per_token * 1e-6) if us_per_token > 0 else None


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
            if entry.disagg is not None:
                setups.append(disagg_setup(workload, entry, f"plan[{i}]"))
                if entry.tokenize_us_per_token:
                    notes.append(f"plan[{i}]: tokenize_us_per_token is not simulated on a disaggregated entry")
                continue
            setups.append(
                gpu_setup(
                    workload,
                    entry.model,
                    entry.gpu,
                    entry.tp,
                    entry.kv_cache_dtype,
                    entry.weight_dtype,
                    target=f"plan[{i}]",
                    backend=entry.backend,
                    backend_version=entry.backend_version,
                    ep=entry.ep,
                    dp=entry.dp,
                    moe_kernel=entry.moe_kernel,
                    tokenize_us_per_token=entry.tokenize_us_per_token,
                )
            )
        except KvplanError as err:
            if err.field.startswith("engine."):  # the engine section's, shared by every target
                raise
            if err.field == "KV budget":  # the entry's own sizing, as the load test's estimate says it
                raise KvplanError(
                    f"plan[{i}]",
                    err.problem,
                    "use a larger gpu, a higher tp or a smaller weight_dtype in this plan entry",
                    source=workload.source,
                ) from None
            raise err.within(source=workload.source, prefix=f"plan[{i}]") from None
    return setups, notes


def disagg_setup(workload: Workload, entry: Any, target: str) -> SimSetup:
    """A plan entry with ``disagg:`` (kvplan.workload.deployment.Disagg): each pool a GPU target of
    its own tp and scheduler limits (:func:`gpu_setup`), simulated together on
    kvplan.run.sim.disagg's backend, the prompt's KV priced over the link per rank at the smaller
    tp. Its ``facts`` (fit checks, the search's top) are the decode pool's with the smaller pool
    of the two and ``max_num_seqs`` x the decode workers.

    A pool timed by measured silicon takes aiconfigurator-core's operation times as they are
    (``SiliconFit()``: scales 1, no overheads), not the backend's correction in
    ``data/silicon_fit.yaml``: that was fitted on aggregated H100 serving runs, where it also
    absorbs how each backend's own scheduler mixes prefill and decode, which a pool that runs
    one phase does not do; on the 64 disaggregated runs without attention DP of the check set
    the corrected times were further off (median |error| TTFT 53.5 % and TPOT 15.7 %, against
    46.3 % and 11.9 %; docs/simulate.md, "Pools on the operation times alone").

    Raises:
        KvplanError: what gpu_setup raises, a pool's tp or ep named ``disagg.<pool>.tp`` (plan_setups
            puts the entry's ``plan[i]`` in front).
    """
    from kvplan.run.sim.disagg import DisaggBackend
    from kvplan.sizing import kv_math
    from kvplan.sizing.gpus.links import lookup_link
    from kvplan.sizing.gpus.silicon import SiliconFit

    disagg = entry.disagg
    link = lookup_link(disagg.link, "disagg.link")
    pools = []
    for role, pool in (("prefill", disagg.prefill), ("decode", disagg.decode)):
        limits = {"max_num_seqs": pool.max_num_seqs, "max_num_batched_tokens": pool.max_num_batched_tokens}
        engine = workload.engine.model_copy(update={k: v for k, v in limits.items() if v is not None})
        tp = pool.tp or entry.tp
        try:
            setup = gpu_setup(
                workload.model_copy(update={"engine": engine}),
                entry.model,
                entry.gpu,
                tp,
                entry.kv_cache_dtype,
                entry.weight_dtype,
                target=target,
                backend=entry.backend,
                backend_version=entry.backend_version,
                ep=pool.ep or entry.ep,
                dp=pool.dp or entry.dp,
                moe_kernel=entry.moe_kernel,
                silicon_fit=SiliconFit(),  # the operation times alone (docstring)
            )
        except KvplanError as err:
            if err.field in ("tp", "ep", "dp"):
                raise err.within(prefix=f"disagg.{role}") from None
            raise
        no_tiers = {"offload_host_blocks": 0, "offload_disk_blocks": 0}  # the disaggregated engine has none
        pools.append((setup.with_facts(setup.facts.model_copy(update=no_tiers)), pool.workers, tp, pool.dp or entry.dp))
    (pre, x, tp_p, dp_p), (dec, y, tp_d, dp_d) = pools
    spec = ModelSpec.from_hf_config(*load_model_config(workload.resolve_model(entry.model))[:2])
    layers = kv_math.rank_layer_specs(spec, entry.kv_cache_dtype, min(tp_p, tp_d))
    block = workload.engine.block_size

    def backend() -> DisaggBackend:
        return DisaggBackend(
            (pre.facts, pre.clock, x),
            (dec.facts, dec.clock, y),
            link,
            lambda n: kv_math.request_bytes(layers, n, block),
            disagg.first_token,
        )

    shape = f"{x}P tp{tp_p}{f' dp{dp_p}' * (dp_p > 1)} + {y}D tp{tp_d}{f' dp{dp_d}' * (dp_d > 1)} over {link.name}" + (
        ", first token from decode" if disagg.first_token == "decode" else ""
    )
    facts = dec.facts.model_copy(
        update={
            "num_blocks": min(pre.facts.num_blocks, dec.facts.num_blocks),
            "max_num_seqs": y * dec.facts.max_num_seqs,
        }
    )
    label = dec.cost_model.step_times  # the report's step times: say that the pools take no fit
    label += ", unfitted" if label.startswith("silicon") else ""
    info = dec.cost_model.model_copy(
        update={"description": f"{shape}; {dec.cost_model.description}", "step_times": label}
    )
    notes = tuple(dict.fromkeys(pre.notes + dec.notes))  # both pools on one GPU: one note, not two
    if workload.engine.offload.is_on:
        notes += (f"{target}: a disaggregated target is simulated without engine.offload's tiers",)
    return replace(dec, facts=facts, cost_model=info, notes=notes, make_backend=backend, disagg=shape, tp=tp_d)
