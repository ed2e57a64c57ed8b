"""GPU capacity: the KV budget on one GPU rank, and how many blocks, tokens and requests it holds.

Budget (vLLM's memory profile, as its start-up log prints it; see tests/kvplan/data/vllm_kv_logs.yaml)::

    kv_budget = gpu_memory x gpu_memory_utilization - weights per rank - overhead (activations, CUDA context, graphs)
    num_blocks = floor(kv_budget / bytes_per_block)           bytes_per_block = bytes_per_token x block_size
    kv_capacity_tokens = num_blocks x block_size
    max_concurrency = num_blocks x bytes_per_block / per-request bytes
    per-request bytes = paged KV of one max_model_len request + its fixed state (recurrent layers)

or ``kv_memory_gib`` gives the budget directly (vLLM's ``available_kv_cache_memory`` line).
All sizes are per GPU rank; GiB = 2**30 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvplan.errors import KvplanError
from kvplan.sizing import kv_math
from kvplan.sizing.gpus.gpus import lookup_gpu
from kvplan.sizing.models.model_spec import ModelSpec
from kvplan.sizing.models.weights import count_parameters, weights_bytes

GiB = 2**30
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
# Non-KV, non-weight memory: the profiling run's activation peak + CUDA context, NCCL and CUDA
# graphs. vLLM logs show 1-3 GiB: 2.12 + 0.14 GiB for Mistral-Small-24B on an H100 (cases file),
# 1.26 + 1.79 GiB for Llama-3-8B on an H100 (vllm-project/vllm PR #10511).
DEFAULT_OVERHEAD_GIB = 2.0
# Input bounds: far beyond any GPU or model, low enough that byte counts stay within float range.
MAX_GIB = 2**20  # 1 PiB per GPU
MAX_TOKENS = 2**30  # per request, and per block
DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size: the planner's, for a server kvplan sizes


@dataclass(frozen=True)
class Capacity:
    """KV capacity of one GPU rank. Bytes are integers; ``None`` where no budget was given.
    ``gpu`` and ``gpu_memory_bytes`` are set whenever a GPU is given, ``overhead_bytes`` only when
    the budget is computed from it (not given as ``kv_memory_gib``).

    ``kv_capacity_tokens`` counts every attention layer as holding every token and leaves the
    fixed state out; for models with sliding-window layers it is therefore a lower bound, while
    ``max_concurrency`` and ``max_model_len_fit`` account for the windows and the state
    (per-request bytes). A model without attention layers has no blocks: ``num_blocks`` and
    ``kv_capacity_tokens`` stay None and the whole budget holds states.

    ``per_request_bytes`` is the paged KV plus ``per_request_state_bytes``, the fixed conv and
    recurrent state of the linear-attention, Mamba and conv layers (0 for pure attention
    models), held in ``state_dtype`` (``{"conv": ..., "recurrent": ...}``, None without state).

    ``max_model_len_fit`` is set only when one ``max_model_len`` request does not fit: the largest
    length (whole blocks) that does, as vLLM's "estimated maximum model length" reports it.
    """

    model: str
    kv_cache_dtype: str
    tp: int
    pp: int
    block_size: int
    max_model_len: int
    bytes_per_token: int
    bytes_per_token_all_ranks: int
    bytes_per_block: int
    per_request_bytes: int  # paged KV of one max_model_len request + its fixed state
    num_parameters: int | None  # None when the config lacks the sizes (KV-only estimate)
    weights_bytes: int | None  # per rank
    gpu: str | None = None
    gpu_memory_bytes: int | None = None
    overhead_bytes: int | None = None
    kv_budget_bytes: int | None = None
    num_blocks: int | None = None
    kv_capacity_tokens: int | None = None
    max_concurrency: float | None = None
    max_model_len_fit: int | None = None
    per_request_state_bytes: int = 0
    state_dtype: dict[str, str] | None = None


def estimate_capacity(
    spec: ModelSpec,
    *,
    kv_cache_dtype: str = "auto",
    tp: int = 1,
    pp: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_model_len: int | None = None,
    gpu: str | None = None,
    gpu_memory_gib: float | None = None,
    gpu_memory_utilization: float | None = None,
    weights_gib: float | None = None,
    weight_dtype: str = "auto",
    overhead_gib: float | None = None,
    kv_memory_gib: float | None = None,
) -> Capacity:
    """Blocks, tokens and concurrent ``max_model_len`` requests that fit on one GPU rank.

    The budget is ``kv_memory_gib`` when given, else GPU memory (``gpu`` from the bundled table or
    ``gpu_memory_gib``) x utilization - weights / (tp x pp) - overhead; with neither, only the
    per-token and per-request sizes are filled in. Utilization and overhead default (None) to
    vLLM's 0.9 and DEFAULT_OVERHEAD_GIB. ``max_model_len`` defaults to the model's limit
    (``derived_max_model_len``; ``max_position_embeddings`` when the config names none).

    Raises:
        KvplanError: a bad setting, named by its flag: a GiB value that is not finite or out of
            range, a block size or max_model_len out of [1, MAX_TOKENS], a max_model_len beyond
            the model's own limit (vLLM refuses it too); settings that contradict or go unused
            (see :func:`_check_budget_settings`); a ``kv_memory_gib`` above the GPU's memory; a
            budget at or below zero (by how many GiB the weights and overhead exceed the usable
            GPU memory), or one that holds not one block.
    """
    _check(
        1 <= block_size <= MAX_TOKENS, "block_size", f"must be between 1 and {MAX_TOKENS:,} tokens (got {block_size})"
    )
    if gpu_memory_utilization is not None:
        _check(
            0 < gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            f"must be in (0, 1] (got {gpu_memory_utilization})",
        )
    for flag, gib, zero_ok in (
        ("gpu_memory_gib", gpu_memory_gib, False),
        ("kv_memory_gib", kv_memory_gib, False),
        ("weights_gib", weights_gib, True),
        ("overhead_gib", overhead_gib, True),
    ):
        _check_gib(flag, gib, zero_ok)
    _check_budget_settings(
        gpu,
        gpu_memory_gib,
        kv_memory_gib,
        {"weights_gib": weights_gib, "overhead_gib": overhead_gib, "gpu_memory_utilization": gpu_memory_utilization},
    )
    max_model_len = _max_model_len(spec, max_model_len)
    stages = kv_math.stage_layer_specs(spec, kv_cache_dtype, tp, pp)
    layers = kv_math.limiting_stage(stages)
    per_token = kv_math.layers_bytes_per_token(layers)
    num_parameters: int | None
    try:
        num_parameters = sum(count_parameters(spec))
    except KvplanError:
        if weights_gib is None and kv_memory_gib is None and (gpu or gpu_memory_gib):
            raise  # the budget needs the weights
        num_parameters = None
    weights: int | None
    if weights_gib is not None:
        weights = int(weights_gib * GiB)
    else:
        weights = weights_bytes(spec, weight_dtype) // (tp * pp) if num_parameters is not None else None
    capacity: dict[str, Any] = dict(
        model=spec.name,
        kv_cache_dtype=kv_math.kv_dtype_of(spec, kv_cache_dtype).name,
        tp=tp,
        pp=pp,
        block_size=block_size,
        max_model_len=max_model_len,
        bytes_per_token=per_token,
        bytes_per_token_all_ranks=tp * sum(kv_math.layers_bytes_per_token(stage) for stage in stages),
        bytes_per_block=per_token * block_size,
        per_request_bytes=kv_math.request_bytes(layers, max_model_len, block_size),
        num_parameters=num_parameters,
        weights_bytes=weights,
        gpu=gpu,
        per_request_state_bytes=kv_math.request_state_bytes(layers),
        state_dtype=_state_dtype(layers),
    )
    budget = _budget(capacity, gpu, gpu_memory_gib, gpu_memory_utilization, overhead_gib, kv_memory_gib)
    if budget is None:
        return Capacity(**capacity)
    if per_token == 0:  # no attention layer on this rank: no blocks, the budget holds states
        return Capacity(**capacity, kv_budget_bytes=budget, max_concurrency=budget / capacity["per_request_bytes"])
    num_blocks = budget // capacity["bytes_per_block"]
    if num_blocks == 0:  # vLLM stops too: "No available memory for the cache blocks"
        raise KvplanError(
            "KV budget",
            f"{_size(budget)} holds not one block of {block_size:,} tokens "
            f"({_size(capacity['bytes_per_block'])} at {per_token:,} bytes per token)",
            f"give a smaller `block_size` (vLLM's default is {DEFAULT_BLOCK_SIZE}) or a larger budget",
        )
    return Capacity(
        **capacity,
        kv_budget_bytes=budget,
        num_blocks=num_blocks,
        kv_capacity_tokens=num_blocks * block_size,
        max_concurrency=num_blocks * capacity["bytes_per_block"] / capacity["per_request_bytes"],
        max_model_len_fit=_max_len_fit(layers, num_blocks * capacity["bytes_per_block"], max_model_len, block_size),
    )


def _state_dtype(layers) -> dict[str, str] | None:
    """Dtype of the conv and recurrent states (the first state layer's; all share them)."""
    state = next((layer for layer in layers if isinstance(layer, kv_math.StateSpec)), None)
    if state is None:
        return None
    return dict(zip(("conv", "recurrent"), (dtype.name for dtype in state.dtypes)))


def _check(ok: bool, where: str, problem: str, fix: str | None = None) -> None:
    if not ok:
        raise KvplanError(where, problem, fix)


def _check_budget_settings(gpu, gpu_memory_gib, kv_memory_gib, budget_flags: dict[str, float | None]) -> None:
    """Reject settings that contradict or that the budget would ignore (``budget_flags``: flag ->
    value, None when not given): gpu with gpu_memory_gib; weights, overhead or utilization
    with kv_memory_gib, which is the pool itself; overhead or utilization with no GPU at all."""
    if gpu is not None and gpu_memory_gib is not None:
        raise KvplanError(
            "gpu_memory_gib", f"given with `gpu` {gpu}; it stands instead of `gpu`", "drop one of the two"
        )
    given = [flag for flag, value in budget_flags.items() if value is not None]
    if kv_memory_gib is not None and given:
        it, has, them = ("it", "has", "it") if len(given) == 1 else ("they", "have", "them")
        raise KvplanError(
            ", ".join(given),
            f"`kv_memory_gib` gives the KV pool directly, so {it} {has} no effect",
            f"drop {them} or drop `kv_memory_gib`",
        )
    given = [flag for flag in given if flag != "weights_gib"]  # weights are shown even without a GPU
    if kv_memory_gib is None and gpu is None and gpu_memory_gib is None and given:
        raise KvplanError(
            ", ".join(given),
            "no effect without a GPU to budget",
            "give `gpu` or `gpu_memory_gib`, or drop " + ("it" if len(given) == 1 else "them"),
        )


def _size(num_bytes: int) -> str:
    """``17.83 GiB``, or exact bytes below 0.01 GiB, where two decimals of GiB would read 0.00."""
    return f"{num_bytes / GiB:,.2f} GiB" if num_bytes >= GiB / 100 else f"{num_bytes:,} bytes"


def _check_gib(flag: str, gib: float | None, zero_ok: bool) -> None:
    """A GiB flag lies in [0, MAX_GIB] (> 0 unless ``zero_ok``); NaN and inf fail the comparisons."""
    if gib is not None:
        in_range = 0 <= gib <= MAX_GIB and (zero_ok or gib > 0)
        low = ">= 0" if zero_ok else "> 0"
        _check(in_range, flag, f"must be a finite number of GiB, {low} and at most {MAX_GIB:,} (got {gib})")


def _max_model_len(spec: ModelSpec, max_model_len: int | None) -> int:
    """``max_model_len``, or the model's default, checked against the model's own limit: vLLM
    refuses a longer one ("User-specified max_model_len ... is greater than the derived
    max_model_len"). A config that names no length sets no limit: the model's is unknown (vLLM
    assumes 2048, and some versions then take the user's value)."""
    limit = spec.derived_max_model_len
    if max_model_len is None:
        return limit or spec.max_position_embeddings
    _check(
        1 <= max_model_len <= MAX_TOKENS,
        "max_model_len",
        f"must be between 1 and {MAX_TOKENS:,} tokens (got {max_model_len})",
    )
    if limit is not None and max_model_len > limit:
        source = "max_position_embeddings" if limit == spec.max_position_embeddings else "scaled by its rope_scaling"
        raise KvplanError(
            "max_model_len",
            f"{max_model_len:,} exceeds the model's limit of {limit:,} tokens ({source})",
            f"give at most {limit}",
        )
    return max_model_len


def _budget(capacity: dict, gpu, gpu_memory_gib, utilization, overhead_gib, kv_memory_gib) -> int | None:
    """KV budget in bytes (None with neither a GPU nor ``kv_memory_gib``); fills in the GPU fields."""
    total_gib = gpu_memory_gib
    if gpu is not None:
        capacity["gpu"], total_gib = lookup_gpu(gpu)
    if total_gib is not None:
        capacity["gpu_memory_bytes"] = int(total_gib * GiB)
    if kv_memory_gib is not None:
        if total_gib is not None and kv_memory_gib > total_gib:
            memory = f"the {capacity['gpu']}'s" if gpu is not None else "`gpu_memory_gib`"
            raise KvplanError(
                "kv_memory_gib",
                f"a KV pool of {kv_memory_gib:g} GiB exceeds {memory} {total_gib:g} GiB of memory",
                "give the pool vLLM reports for this GPU, or the GPU it ran on",
            )
        return int(kv_memory_gib * GiB)
    if total_gib is None:
        return None
    utilization = DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else utilization
    overhead_gib = DEFAULT_OVERHEAD_GIB if overhead_gib is None else overhead_gib
    capacity["overhead_bytes"] = int(overhead_gib * GiB)
    usable = int(total_gib * utilization * GiB)
    budget = usable - capacity["weights_bytes"] - capacity["overhead_bytes"]
    if budget <= 0:
        need = (capacity["weights_bytes"] + capacity["overhead_bytes"]) / GiB
        raise KvplanError(
            "KV budget",
            f"weights {capacity['weights_bytes'] / GiB:.2f} GiB + overhead {overhead_gib:.2f} GiB = {need:.2f} GiB "
            f"exceed {total_gib:.2f} GiB x {utilization} = {usable / GiB:.2f} GiB by {-budget / GiB:.2f} GiB",
            "use a larger GPU, more `tp`/`pp`, a smaller `weight_dtype`, or give `kv_memory_gib`",
        )
    return budget


def _max_len_fit(layers, pool_bytes: int, max_model_len: int, block_size: int) -> int | None:
    """Largest length in whole blocks (<= max_model_len) whose paged KV and fixed state fit in
    ``pool_bytes``; None when a max_model_len request fits (0 when not even the state does).
    Binary search: paged bytes grow with length."""
    if kv_math.request_bytes(layers, max_model_len, block_size) <= pool_bytes:
        return None
    if kv_math.request_state_bytes(layers) > pool_bytes:
        return 0
    low, high = 0, math.ceil(max_model_len / block_size)  # low fits (0 tokens), high does not
    while high - low > 1:
        mid = (low + high) // 2
        if kv_math.request_bytes(layers, mid * block_size, block_size) <= pool_bytes:
            low = mid
        else:
            high = mid
    return low * block_size
