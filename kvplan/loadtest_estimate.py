"""kvplan's estimate for a load test: what the run should use, set against what it measured.

Built from the engine's own model config and KV dtype before the first request, and saved first,
so even a crashed run keeps it. ``KVPricing`` turns each engine step into the four KV sizes the
report compares (ideal, paged, contiguous, measured); ``plan_target`` sizes the same buckets on
production GPUs through kvplan's capacity estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.prompts import SampledRequest
from kvplan.workload import Workload

_KV_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}


def kv_dtype_name(torch_dtype) -> str:
    """kvplan's name for the engine's KV cache dtype (torch.bfloat16 -> "bf16")."""
    return _KV_DTYPE_NAMES[str(torch_dtype).removeprefix("torch.")]


@dataclass(frozen=True)
class KVPricing:
    """kvplan's per-token price of the engine's KV, and the engine's real per-block price.

    Turns one StepStats into the four KV sizes of a StepRecord (bytes): ideal = sum(resident
    tokens) x bytes_per_token; paged = sum(ceil(tokens / block_size)) x bytes_per_token x
    block_size; contiguous = requests holding KV x max_model_len x bytes_per_token; measured =
    used blocks x engine_bytes_per_block.
    """

    bytes_per_token: int
    block_size: int
    max_model_len: int
    engine_bytes_per_block: int

    def step_bytes(self, stats) -> tuple[int, int, int, int]:
        resident = stats.kv_resident_tokens
        blocks = sum(-(-t // self.block_size) for t in resident)
        return (
            sum(resident) * self.bytes_per_token,
            blocks * self.block_size * self.bytes_per_token,
            len(resident) * self.max_model_len * self.bytes_per_token,
            stats.num_used_blocks * self.engine_bytes_per_block,
        )


def _max_concurrency(layers, pool_bytes: int, num_tokens: int, block_size: int) -> int:
    """Whole requests of ``num_tokens`` tokens whose paged KV fits in ``pool_bytes`` at once."""
    from kvplan.kv_math import request_kv_bytes

    return pool_bytes // request_kv_bytes(layers, max(num_tokens, 1), block_size)


def compute_estimate(workload: Workload, engine, sampled: dict[str, list[SampledRequest]]) -> tuple[dict, KVPricing]:
    """kvplan's prediction for this run, from the engine's own model config and KV dtype.

    Pool: ``num_blocks`` as given, or floor(kv_cache_memory / bytes per block) (engine default
    256 MiB). Per bucket: P95 request length (prompt + output tokens) and the max concurrency:
    how many requests of that length fit the pool at once in whole blocks (capacity.py's
    ``num_blocks x bytes_per_block / per-request paged bytes``, rounded down).
    Per plan target: the same, on that model, GPU, tp and KV dtype (kvplan's capacity estimate).
    With a shared prefix: ``shared_prefix`` adds the bytes of the prefix's full blocks, which
    every further request of a group (and tenant) in flight saves (kv_math.shared_prefix_bytes).
    """
    from engine.config import DEFAULT_KV_CACHE_MEMORY_BYTES
    from kvplan.kv_math import layers_bytes_per_token, rank_layer_specs, shared_prefix_bytes
    from kvplan.metrics import p95_request_tokens
    from kvplan.model_spec import ModelSpec

    spec = ModelSpec.from_hf_config(engine.hf_config.to_dict(), name=engine.model_name)
    kv_dtype = kv_dtype_name(engine.kv_cache_dtype)
    layers = rank_layer_specs(spec, kv_dtype)
    bpt = layers_bytes_per_token(layers)
    block_size = workload.engine.block_size
    bpb = bpt * block_size
    memory = workload.engine.kv_cache_memory or DEFAULT_KV_CACHE_MEMORY_BYTES
    num_blocks = workload.engine.num_blocks or memory // bpb
    p95 = {name: p95_request_tokens([r.num_tokens for r in reqs]) for name, reqs in sampled.items()}
    buckets = [
        {"name": name, "num_requests": len(sampled[name]), "p95_request_tokens": tokens,
         "blocks_per_request": -(-tokens // block_size),
         "max_concurrency": _max_concurrency(layers, num_blocks * bpb, tokens, block_size)}
        for name, tokens in p95.items()
    ]
    estimate = {
        "model": spec.name, "kv_dtype": kv_dtype, "bytes_per_token": bpt, "bytes_per_block": bpb,
        "block_size": block_size, "num_blocks": num_blocks, "pool_tokens": num_blocks * block_size,
        "pool_bytes": num_blocks * bpb, "buckets": buckets,
        "plan": [plan_target(workload, i, p95) for i in range(len(workload.plan))],
    }
    if (prefix := workload.shared_prefix) is not None:
        estimate["shared_prefix"] = {**prefix.model_dump(), "num_full_blocks": prefix.num_tokens // block_size,
                                     "shared_bytes_per_request": shared_prefix_bytes(layers, prefix.num_tokens,
                                                                                     prefix.num_tokens, block_size)}
    pricing = KVPricing(bpt, engine.block_size, engine.max_model_len, engine.bytes_per_block)
    return estimate, pricing


_PLAN_FLAGS = {"--model": "model", "--gpu": "gpu", "--tp": "tp", "--kv-cache-dtype": "kv_dtype"}


def plan_target(workload: Workload, index: int, p95: dict[str, int]) -> dict:
    """Size every bucket's P95 request on ``workload.plan[index]`` with kvplan's capacity
    estimate (vLLM defaults: block size 16, 0.9 GPU memory utilization, weights and overhead
    subtracted). ``p95``: bucket name -> P95 request tokens (an empty dict checks the target).

    Raises:
        KvplanError: an unknown model, GPU or KV dtype, a bad tp, or a model that leaves no KV
            budget on that GPU: named ``<workload>: plan[i].<field>``.
    """
    from kvplan.capacity import estimate_capacity
    from kvplan.model_source import load_model_spec

    target = workload.plan[index]
    try:
        spec = load_model_spec(target.model)
        sized = {
            name: estimate_capacity(spec, kv_cache_dtype=target.kv_dtype, tp=target.tp, gpu=target.gpu,
                                    max_model_len=max(tokens, 1))
            for name, tokens in (p95 or {"": spec.max_position_embeddings}).items()
        }
    except KvplanError as err:
        field = _PLAN_FLAGS.get(err.where, "")
        fix = err.fix  # the CLI's fixes name flags; a plan entry has only its four fields
        if err.where == "--gpu":
            from kvplan.capacity import gpu_table

            fix = f"use one of {', '.join(sorted(gpu_table()))}"
        elif err.where == "KV budget":
            fix = "use a larger gpu or a higher tp in this plan entry"
        raise KvplanError(f"{workload.source}: plan[{index}]{'.' + field if field else ''}",
                          err.problem, fix) from None
    first = next(iter(sized.values()))
    return {
        "model": target.model, "gpu": target.gpu, "tp": target.tp, "kv_dtype": first.kv_cache_dtype,
        "bytes_per_token": first.bytes_per_token, "num_blocks": first.num_blocks,
        "kv_capacity_tokens": first.kv_capacity_tokens,
        "buckets": [{"name": name, "max_concurrency": int(c.max_concurrency)} for name, c in sized.items() if name],
    }
