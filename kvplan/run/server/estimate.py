"""kvplan's estimate for a target run, set beside the KV pool the server reports.

The server gives its pool (vLLM: ``num_gpu_blocks`` x ``block_size`` from ``cache_config_info``;
SGLang: pages x page size from its ``cache_config_info``, else ``max_total_num_tokens``;
llama.cpp: slots x each slot's context from ``/props``). ``target.estimate_model``
(``--model``: a preset, config.json or GGUF) gives kvplan's bytes per token for the served model
at ``target.kv_cache_dtype`` (``auto``: the server's ``cache_dtype`` where it names one) and
tensor parallelism ``target.tp`` (per GPU rank). With those the run gets the same estimate an
in-process run has: per bucket, how many P95-length requests fit the pool at once in whole
blocks (llama.cpp: cells, at most one request per slot, within a slot's context), set against
the measured knee. With ``target.gpu`` kvplan also sizes the pool itself (its capacity
estimate: vLLM's 0.9 memory utilisation, weights and overhead subtracted) and the note states
how far the server's pool is from it.
"""

from __future__ import annotations

from kvplan.errors import KvplanError
from kvplan.results.metrics import p95_request_tokens
from kvplan.results.run_result import BucketEstimate, RunEstimate
from kvplan.run.server.server_metrics import SGLANG_HYBRID_NAMES
from kvplan.sizing import dtypes
from kvplan.sizing.capacity import DEFAULT_BLOCK_SIZE, estimate_capacity
from kvplan.sizing.kv_math import layers_bytes_per_token, rank_layer_specs, request_kv_bytes
from kvplan.sizing.models.model_source import load_model_spec
from kvplan.traffic.requests import SampledRequest
from kvplan.workload.schema import Workload

GIB = 2**30


def _kv_dtype(setting: str, server: str | None) -> str:
    if setting != "auto" or not server or server == "auto":
        return setting
    try:
        return dtypes.canonical(server)
    except KvplanError:  # a dtype name kvplan does not know: the model's own
        return "auto"


def target_estimate(
    workload: Workload,
    pool: tuple[int | None, int | None, int | None, str | None],
    sampled: dict[str, list[SampledRequest]],
    slots: tuple[int, int] | None = None,
) -> tuple[RunEstimate | None, str]:
    """(kvplan's estimate for the run or None, one line setting the server's pool beside it).
    ``pool``: the server's (num_gpu_blocks, block_size, pool tokens, cache dtype), None where not
    exposed; ``slots``: llama.cpp's (slots, tokens of context each), whose product is the pool.

    Raises:
        KvplanError: ``target.estimate_model`` or ``target.gpu`` kvplan does not know, named so.
    """
    target, source = workload.target, workload.source
    assert target is not None  # a target run's workload
    blocks, block_size, tokens, cache_dtype = pool
    shown = (
        f"{slots[0]} slots x {slots[1]:,} tokens of context = {tokens:,} tokens (llama.cpp, per-slot"
        f" contexts; with a unified KV, its default without --parallel, the slots share {slots[1]:,})"
        if slots and tokens
        else f"{blocks:,} blocks x {block_size} tokens = {tokens:,} tokens"
        if blocks and block_size and tokens
        else f"{tokens:,} tokens"
        if tokens
        else None
    )
    if target.estimate_model is None:
        return None, (
            f"server KV pool: {shown}; give `--model` (target.estimate_model) for kvplan's estimate"
            if shown
            else "server KV pool: not exposed"
        )
    try:
        spec = load_model_spec(workload.resolve_model(target.estimate_model))
        kv_dtype = _kv_dtype(target.kv_cache_dtype, cache_dtype)
        layers = rank_layer_specs(spec, kv_dtype, target.tp)
        size = block_size or (1 if slots else DEFAULT_BLOCK_SIZE)  # llama.cpp allocates cells, not blocks
        ours = (
            estimate_capacity(spec, kv_cache_dtype=kv_dtype, tp=target.tp, gpu=target.gpu, block_size=size)
            if target.gpu
            else None
        )
    except KvplanError as err:
        field = {"gpu": "target.gpu", "tp": "target.tp", "kv_cache_dtype": "target.kv_cache_dtype"}.get(
            err.field, "target.estimate_model"
        )
        raise KvplanError(
            field, err.problem if err.source is None else f"{err.where}: {err.problem}", err.fix, source=source
        ) from None
    bpt = layers_bytes_per_token(layers)
    num_blocks = blocks or (tokens // size if tokens else None) or (ours.num_blocks if ours else None)
    note = [f"server KV pool: {shown}" if shown else "server KV pool: not exposed"]
    if tokens:
        note.append(
            f"{tokens * bpt / GIB:,.2f} GiB per GPU at kvplan's {bpt:,} bytes/token for {spec.name}"
            f" ({kv_dtype} KV, tp {target.tp})"
        )
    else:
        note.append(f"kvplan's {bpt:,} bytes/token for {spec.name} ({kv_dtype} KV, tp {target.tp})")
    if ours is not None and ours.num_blocks:
        if blocks:
            diff = blocks / ours.num_blocks - 1
            verdict = "matches" if blocks == ours.num_blocks else f"server has {diff:+.1%}"
            note.append(f"kvplan's estimate on {target.gpu}: {ours.num_blocks:,} blocks ({verdict})")
        else:
            note.append(f"kvplan's estimate on {target.gpu}: {ours.num_blocks:,} blocks of {size}")
    if cache_dtype and _kv_dtype("auto", cache_dtype) != kv_dtype and target.kv_cache_dtype != "auto":
        note.append(f"mismatch: the server's KV dtype is {cache_dtype}, the estimate uses {kv_dtype}")
    if num_blocks is None:
        return None, "; ".join(note)
    bpb = bpt * size
    buckets = []
    for name, reqs in sampled.items():
        p95 = p95_request_tokens([r.num_tokens for r in reqs])
        fit = num_blocks * bpb // request_kv_bytes(layers, max(p95, 1), size)
        if slots:  # llama.cpp: one request per slot, within its slot's context
            fit = min(fit, slots[0]) if p95 <= slots[1] else 0
        buckets.append(
            BucketEstimate(
                name=name,
                num_requests=len(reqs),
                p95_request_tokens=p95,
                blocks_per_request=-(-p95 // size),
                max_concurrency=fit,
            )
        )
    estimate = RunEstimate(
        model=spec.name,
        kv_cache_dtype=kv_dtype,
        bytes_per_token=bpt,
        bytes_per_block=bpb,
        block_size=size,
        num_blocks=num_blocks,
        pool_tokens=num_blocks * size,
        pool_bytes=num_blocks * bpb,
        buckets=buckets,
    )
    return estimate, "; ".join(note)


def _is_hybrid(workload: Workload) -> bool:
    """Whether the served model, as kvplan knows it (``target.estimate_model``, else the model an
    ``engine:`` section names), has layers beside full attention: sliding-window, Mamba, linear
    attention or convolution state. False when kvplan knows no such model."""
    target = workload.target
    assert target is not None  # a target run's workload
    model = target.estimate_model or (workload.engine.model if "model" in workload.engine.model_fields_set else None)
    if model is None:
        return False
    try:
        spec = load_model_spec(workload.resolve_model(model))
    except KvplanError:
        return False
    return any(layer.kind in ("sliding", "linear", "mamba", "conv") or layer.state for layer in spec.layers)


def kv_usage_note(workload: Workload, name: str | None, seen: tuple[str, ...]) -> str | None:
    """None when the server's usage gauge ``name`` is KV cache usage; else what it measures.
    SGLang's ``sglang:token_usage`` is the highest usage over its full-attention KV pool and, on a
    hybrid model, its sliding-window and Mamba state pools (sglang/srt/observability/
    metrics_collector.py SchedulerStats; sgl-project/sglang#5979), so on a hybrid model (the
    server exposes those pools' gauges, or kvplan knows the model's layers) it is not KV usage."""
    if name != "sglang:token_usage":
        return None
    if any(n in seen for n in SGLANG_HYBRID_NAMES) or _is_hybrid(workload):
        return (
            "sglang:token_usage of a hybrid model: the highest usage over its KV, sliding-window and Mamba"
            " state pools, not KV cache usage (sgl-project/sglang#5979)"
        )
    return None
