"""GPU capacity: the KV budget on one GPU rank, and how many blocks, tokens and requests it holds.

Budget (vLLM's memory profile, as its start-up log prints it; see ../shared/cases/vllm_kv_logs.yaml)::

    kv_budget = gpu_memory x gpu_memory_utilization - weights per rank - overhead (activations, CUDA context, graphs)
    num_blocks = floor(kv_budget / bytes_per_block)           bytes_per_block = bytes_per_token x block_size
    kv_capacity_tokens = num_blocks x block_size
    max_concurrency = num_blocks / blocks one max_model_len request needs   (= ceil(max_model_len / block_size))

or ``kv_memory_gib`` gives the budget directly (vLLM's ``available_kv_cache_memory`` line).
All sizes are per GPU rank; GiB = 2**30 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvplan import kv_math
from kvplan.errors import KvplanError
from kvplan.model_spec import ModelSpec

GiB = 2**30
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
# Non-KV, non-weight memory: the profiling run's activation peak + CUDA context, NCCL and CUDA
# graphs. vLLM logs show 1-3 GiB: 2.12 + 0.14 GiB for Mistral-Small-24B on an H100 (cases file),
# 1.26 + 1.79 GiB for Llama-3-8B on an H100 (vllm-project/vllm PR #10511).
DEFAULT_OVERHEAD_GIB = 2.0
GPUS_FILE = Path(__file__).parent / "data" / "gpus.yaml"
# Input bounds: far beyond any GPU or model, low enough that byte counts stay within float range.
MAX_GIB = 2**20  # 1 PiB per GPU
MAX_TOKENS = 2**30  # per request, and per block
WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


@lru_cache(maxsize=1)
def gpu_table() -> dict[str, dict]:
    """GPU name (upper case) -> entry of kvplan/data/gpus.yaml (``memory_gib``, ``source``, ...)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    entries = yaml.load(GPUS_FILE.read_text(), Loader=loader)["gpus"]
    return {name.upper(): entry for name, entry in entries.items()}


def lookup_gpu(name: str) -> tuple[str, float]:
    """(table name, memory in GiB as its driver reports it) of a bundled GPU. Names match case-insensitively,
    spaces as dashes, and by a unique prefix (``h100`` -> ``H100-80GB``).

    Raises:
        KvplanError: an unknown or ambiguous GPU name (the candidates are listed).
    """
    key = name.upper().replace(" ", "-").replace("_", "-")
    table = gpu_table()
    matches = [key] if key in table else [known for known in table if known.startswith(key)]
    if len(matches) != 1:
        problem = f"ambiguous GPU {name!r}" if matches else f"unknown GPU {name!r}"
        raise KvplanError("--gpu", problem, f"use one of {', '.join(matches or sorted(table))}, or --gpu-memory-gib")
    return matches[0], float(table[matches[0]]["memory_gib"])


def count_parameters(spec: ModelSpec) -> tuple[int, int]:
    """(embedding + LM head parameters, all other parameters), counted from the config.

    Dense layer: attention q, k, v, o (``hidden x heads x head_dim`` and ``hidden x kv_heads x
    head_dim`` each for k and v, biases where the config sets them) + MLP (3 matrices
    ``hidden x intermediate`` when gated, else 2) + 2 norms. MoE layer: every expert's MLP +
    router + shared experts. MLA layer (DeepSeek): q (through ``q_lora_rank`` when set), the
    ``hidden x (kv_lora_rank + qk_rope_head_dim)`` KV down-projection, its up-projection
    ``kv_lora_rank x heads x (qk_nope_head_dim + v_head_dim)`` and o. Small extras (q/k norms,
    attention sinks) are left out: under 0.1 % of any catalog model.

    Raises:
        KvplanError: the config lacks hidden_size, vocab_size or intermediate_size.
    """
    for field, value in (("hidden_size", spec.hidden_size), ("vocab_size", spec.vocab_size),
                         ("intermediate_size", spec.intermediate_size)):
        if value is None:
            raise KvplanError(spec.name, f"missing field {field}", "it sizes the weights; give --weights-gib or --kv-memory-gib")
    if spec.moe is not None and not spec.moe.expert_intermediate_size:
        raise KvplanError(spec.name, "missing field moe_intermediate_size", "give --weights-gib or --kv-memory-gib")
    h, hd = spec.hidden_size, spec.head_dim
    embedding = spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    if spec.mla is not None:
        m = spec.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        heads = spec.num_attention_heads
        q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk if m.q_lora_rank else h * heads * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        attention = q + kv + heads * m.v_head_dim * h
    else:
        q_width, kv_width = spec.num_attention_heads * hd, spec.num_kv_heads * hd
        attention = 2 * h * q_width + 2 * h * kv_width
        attention += (q_width + 2 * kv_width) * spec.qkv_bias + h * spec.o_bias
    mats = 3 if spec.gated_mlp else 2
    dense_mlp = mats * h * spec.intermediate_size
    moe_mlp, moe_layers = 0, ()
    if spec.moe is not None:
        e = spec.moe
        moe_layers = e.moe_layers
        moe_mlp = e.num_experts * 3 * h * e.expert_intermediate_size + h * e.num_experts
        moe_mlp += e.num_experts * (2 * e.expert_intermediate_size + h + 1) if e.expert_bias else 0
        moe_mlp += e.num_shared_experts * 3 * h * e.expert_intermediate_size
        moe_mlp += (3 * h * e.shared_expert_intermediate_size + h) if e.shared_expert_intermediate_size else 0
    layers = spec.num_layers * (attention + 2 * h) + h
    layers += len(moe_layers) * moe_mlp + (spec.num_layers - len(moe_layers)) * dense_mlp
    return embedding, layers


def weights_bytes(spec: ModelSpec, weight_dtype: str = "auto") -> int:
    """Bytes of all weights: parameters x bytes per weight.

    ``auto``: a quantized checkpoint's bits (fp8, AWQ/GPTQ bits, mxfp4) for everything but the
    embeddings and LM head, which stay in the model dtype; otherwise the model dtype (float32
    checkpoints are served in fp16, as vLLM's ``--dtype auto`` does).

    Raises:
        KvplanError: unknown weight dtype.
    """
    embedding, other = count_parameters(spec)
    base = kv_math.resolve_kv_dtype("auto", spec.dtype).element_bits / 8
    if weight_dtype == "auto":
        other_bytes = spec.weight_bits / 8 if spec.weight_bits else base
        return int(embedding * base + other * other_bytes)
    if weight_dtype not in WEIGHT_BYTES:
        raise KvplanError("--weight-dtype", f"unknown dtype {weight_dtype!r}", f"use one of auto, {', '.join(WEIGHT_BYTES)}")
    return int((embedding + other) * WEIGHT_BYTES[weight_dtype])


@dataclass(frozen=True)
class Capacity:
    """KV capacity of one GPU rank. Bytes are integers; ``None`` where no budget was given.
    ``gpu`` and ``gpu_memory_bytes`` are set whenever a GPU is given, ``overhead_bytes`` only when
    the budget is computed from it (not given as ``kv_memory_gib``).

    ``kv_capacity_tokens`` counts every layer as holding every token; for models with
    sliding-window layers it is therefore a lower bound, while ``max_concurrency`` and
    ``max_model_len_fit`` account for the windows (per-request paged bytes).

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
    per_request_bytes: int  # paged KV of one max_model_len request
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


def estimate_capacity(
    spec: ModelSpec,
    *,
    kv_cache_dtype: str = "auto",
    tp: int = 1,
    pp: int = 1,
    block_size: int = 16,
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
    _check(1 <= block_size <= MAX_TOKENS, "--block-size", f"must be between 1 and {MAX_TOKENS:,} tokens (got {block_size})")
    if gpu_memory_utilization is not None:
        _check(0 < gpu_memory_utilization <= 1, "--gpu-memory-utilization", f"must be in (0, 1] (got {gpu_memory_utilization})")
    for flag, gib, zero_ok in (("--gpu-memory-gib", gpu_memory_gib, False), ("--kv-memory-gib", kv_memory_gib, False),
                               ("--weights-gib", weights_gib, True), ("--overhead-gib", overhead_gib, True)):
        _check_gib(flag, gib, zero_ok)
    _check_budget_settings(gpu, gpu_memory_gib, kv_memory_gib, {
        "--weights-gib": weights_gib, "--overhead-gib": overhead_gib, "--gpu-memory-utilization": gpu_memory_utilization})
    max_model_len = _max_model_len(spec, max_model_len)
    stages = kv_math.stage_layer_specs(spec, kv_cache_dtype, tp, pp)
    layers = max(stages, key=kv_math.layers_bytes_per_token)
    per_token = kv_math.layers_bytes_per_token(layers)
    try:
        num_parameters = sum(count_parameters(spec))
    except KvplanError:
        if weights_gib is None and kv_memory_gib is None and (gpu or gpu_memory_gib):
            raise  # the budget needs the weights
        num_parameters = None
    if weights_gib is not None:
        weights = int(weights_gib * GiB)
    else:
        weights = weights_bytes(spec, weight_dtype) // (tp * pp) if num_parameters is not None else None
    capacity = dict(
        model=spec.name,
        kv_cache_dtype=kv_math.resolve_kv_dtype(kv_cache_dtype, spec.dtype).name,
        tp=tp,
        pp=pp,
        block_size=block_size,
        max_model_len=max_model_len,
        bytes_per_token=per_token,
        bytes_per_token_all_ranks=tp * sum(kv_math.layers_bytes_per_token(stage) for stage in stages),
        bytes_per_block=per_token * block_size,
        per_request_bytes=kv_math.request_kv_bytes(layers, max_model_len, block_size),
        num_parameters=num_parameters,
        weights_bytes=weights,
        gpu=gpu,
    )
    budget = _budget(capacity, gpu, gpu_memory_gib, gpu_memory_utilization, overhead_gib, kv_memory_gib)
    if budget is None:
        return Capacity(**capacity)
    num_blocks = budget // capacity["bytes_per_block"]
    if num_blocks == 0:  # vLLM stops too: "No available memory for the cache blocks"
        raise KvplanError("KV budget", f"{_size(budget)} holds not one block of {block_size:,} tokens "
                          f"({_size(capacity['bytes_per_block'])} at {per_token:,} bytes per token)",
                          "give a smaller --block-size (vLLM's default is 16) or a larger budget")
    return Capacity(
        **capacity,
        kv_budget_bytes=budget,
        num_blocks=num_blocks,
        kv_capacity_tokens=num_blocks * block_size,
        max_concurrency=num_blocks * capacity["bytes_per_block"] / capacity["per_request_bytes"],
        max_model_len_fit=_max_len_fit(layers, num_blocks * capacity["bytes_per_block"], max_model_len, block_size),
    )


def _check(ok: bool, where: str, problem: str, fix: str | None = None) -> None:
    if not ok:
        raise KvplanError(where, problem, fix)


def _check_budget_settings(gpu, gpu_memory_gib, kv_memory_gib, budget_flags: dict[str, float | None]) -> None:
    """Reject settings that contradict or that the budget would ignore (``budget_flags``: flag ->
    value, None when not given): --gpu with --gpu-memory-gib; weights, overhead or utilization
    with --kv-memory-gib, which is the pool itself; overhead or utilization with no GPU at all."""
    if gpu is not None and gpu_memory_gib is not None:
        raise KvplanError("--gpu-memory-gib", f"given with --gpu {gpu}; it stands instead of --gpu", "drop one of the two")
    given = [flag for flag, value in budget_flags.items() if value is not None]
    if kv_memory_gib is not None and given:
        it, has, them = ("it", "has", "it") if len(given) == 1 else ("they", "have", "them")
        raise KvplanError(", ".join(given), f"--kv-memory-gib gives the KV pool directly, so {it} {has} no effect",
                          f"drop {them} or drop --kv-memory-gib")
    given = [flag for flag in given if flag != "--weights-gib"]  # weights are shown even without a GPU
    if kv_memory_gib is None and gpu is None and gpu_memory_gib is None and given:
        raise KvplanError(", ".join(given), "no effect without a GPU to budget",
                          "give --gpu or --gpu-memory-gib, or drop " + ("it" if len(given) == 1 else "them"))


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
    _check(1 <= max_model_len <= MAX_TOKENS, "--max-model-len",
           f"must be between 1 and {MAX_TOKENS:,} tokens (got {max_model_len})")
    if limit is not None and max_model_len > limit:
        source = "max_position_embeddings" if limit == spec.max_position_embeddings else "scaled by its rope_scaling"
        raise KvplanError("--max-model-len", f"{max_model_len:,} exceeds the model's limit of {limit:,} tokens ({source})",
                          f"give at most {limit}")
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
            memory = f"the {capacity['gpu']}'s" if gpu is not None else "--gpu-memory-gib"
            raise KvplanError("--kv-memory-gib", f"a KV pool of {kv_memory_gib:g} GiB exceeds {memory} {total_gib:g} GiB "
                              "of memory", "give the pool vLLM reports for this GPU, or the GPU it ran on")
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
            "use a larger GPU, more --tp/--pp, a smaller --weight-dtype, or give --kv-memory-gib",
        )
    return budget


def _max_len_fit(layers, pool_bytes: int, max_model_len: int, block_size: int) -> int | None:
    """Largest length in whole blocks (<= max_model_len) whose paged KV fits in ``pool_bytes``;
    None when a max_model_len request fits. Binary search: paged bytes grow with length."""
    if kv_math.request_kv_bytes(layers, max_model_len, block_size) <= pool_bytes:
        return None
    low, high = 0, math.ceil(max_model_len / block_size)  # low fits (0 tokens), high does not
    while high - low > 1:
        mid = (low + high) // 2
        if kv_math.request_kv_bytes(layers, mid * block_size, block_size) <= pool_bytes:
            low = mid
        else:
            high = mid
    return low * block_size
