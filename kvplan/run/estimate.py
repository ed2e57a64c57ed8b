"""kvplan's estimate for a load test: what the run should use, set against what it measured.

Built from the served model's own config and KV dtype (the engine's facts) before the first
request, and saved first, so even a crashed run keeps it. ``KVPricing`` turns each engine step
into the four KV sizes the report compares (ideal, paged, contiguous, measured); ``plan_target``
sizes the same buckets on production GPUs through kvplan's capacity estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config import DEFAULT_KV_CACHE_MEMORY_BYTES
from kvplan.errors import KvplanError
from kvplan.results.metrics import p95_request_tokens
from kvplan.results.run_lines import grown_blocks
from kvplan.results.run_result import (
    BucketEstimate,
    DeploymentBucket,
    DeploymentEstimate,
    EngineFacts,
    RunEstimate,
    SharedPrefixEstimate,
)
from kvplan.sizing.capacity import Capacity, estimate_capacity
from kvplan.sizing.gpus.gpus import gpu_hint
from kvplan.sizing.kv_math import layers_bytes_per_token, rank_layer_specs, request_kv_bytes, shared_prefix_bytes
from kvplan.sizing.models.model_source import load_model_spec
from kvplan.sizing.models.model_spec import ModelSpec
from kvplan.traffic.requests import SampledRequest
from kvplan.workload.schema import Workload

_PLAN_FIELDS = ("model", "gpu", "tp", "kv_cache_dtype", "weight_dtype")  # a plan entry's sizing fields


@dataclass(frozen=True)
class KVPricing:
    """kvplan's per-token price of the engine's KV, and the engine's real per-block price.

    Turns one step's stats into the four KV sizes of a StepRecord (bytes): ideal =
    sum(resident tokens) x bytes_per_token; paged = sum(ceil(tokens / block_size)) x
    bytes_per_token x block_size; contiguous = requests holding KV x max_model_len x
    bytes_per_token; measured = used blocks x engine_bytes_per_block.
    """

    bytes_per_token: int
    block_size: int
    max_model_len: int
    engine_bytes_per_block: int

    def step_bytes(self, stats: Any) -> dict[str, int]:
        resident = stats.kv_resident_tokens
        blocks = sum(-(-t // self.block_size) for t in resident)
        return {
            "ideal_bytes": sum(resident) * self.bytes_per_token,
            "paged_bytes": blocks * self.block_size * self.bytes_per_token,
            "contiguous_bytes": len(resident) * self.max_model_len * self.bytes_per_token,
            "measured_bytes": stats.num_used_blocks * self.engine_bytes_per_block,
        }

    def run_bytes(self, run: Any) -> dict[str, list[int]]:
        """``step_bytes`` of every step of a decode run (engine.outputs.DecodeRunSteps), as columns
        (name -> one value per step), without the steps: step j's resident tokens are c_i + j + 1
        (their sum ``run.context0 + n x j``), and a request's whole blocks ceil((c_i + j + 1) /
        block_size) grow by one at the steps j where (c_i + j) is a multiple of block_size."""
        k, n, bpt, size = len(run), len(run.computed), self.bytes_per_token, self.block_size
        at_residue = [0] * size  # requests by (c_i mod block_size): a block grows at steps j = -c_i mod size
        for c in run.computed:
            at_residue[c % size] += 1
        blocks = sum(-(-(c + 1) // size) for c in run.computed)
        paged = [blocks]
        for j in range(1, k):
            blocks += at_residue[-j % size]
            paged.append(blocks)
        grown = grown_blocks(run)
        return {
            "ideal_bytes": [(run.context0 + n * j) * bpt for j in range(k)],
            "paged_bytes": [b * size * bpt for b in paged],
            "contiguous_bytes": [n * self.max_model_len * bpt] * k,
            "measured_bytes": [(run.used + g) * self.engine_bytes_per_block for g in grown],
        }


def resident_tokens(requests: list[SampledRequest]) -> list[int]:
    """What each request, or each multi-turn session, keeps resident at its peak, tokens: a request's
    prompt + output; a session's largest turn (its prompt is the whole history, + its max_tokens),
    since one user holds one turn's KV at a time (kvplan.traffic.sessions)."""
    sessions: dict[int, int] = {}
    single = []
    for r in requests:
        if r.session is None:
            single.append(r.num_tokens)
        else:
            sessions[r.session] = max(sessions.get(r.session, 0), r.num_tokens)
    return single + list(sessions.values())


def compute_estimate(
    workload: Workload, facts: EngineFacts, sampled: dict[str, list[SampledRequest]]
) -> tuple[RunEstimate, KVPricing]:
    """kvplan's prediction for this run, from the served model's config and KV dtype.

    Pool: ``num_blocks`` as given, or floor(kv_cache_memory / bytes per block) (engine default
    256 MiB). Per bucket: P95 request length (prompt + output tokens; of a session bucket, each
    session's largest turn: ``resident_tokens``) and the max concurrency:
    how many requests of that length fit the pool at once in whole blocks
    (``num_blocks x bytes_per_block / per-request paged bytes``, rounded down).
    Per plan target: the same, on that model, GPU, tp and KV dtype (kvplan's capacity estimate).
    With a shared prefix: the bytes of the prefix's full blocks, which every further request of
    a group (and tenant) in flight saves (kv_math.shared_prefix_bytes).
    """
    spec = ModelSpec.from_hf_config(facts.hf_config or {}, name=facts.model)
    layers = rank_layer_specs(spec, facts.kv_cache_dtype)
    bpt = layers_bytes_per_token(layers)
    block_size = workload.engine.block_size
    bpb = bpt * block_size
    memory = workload.engine.kv_cache_memory or DEFAULT_KV_CACHE_MEMORY_BYTES
    num_blocks = workload.engine.num_blocks or memory // bpb
    p95 = {name: p95_request_tokens(resident_tokens(reqs)) for name, reqs in sampled.items()}
    buckets = [
        BucketEstimate(
            name=name,
            num_requests=len(sampled[name]),
            p95_request_tokens=tokens,
            blocks_per_request=-(-tokens // block_size),
            max_concurrency=num_blocks * bpb // request_kv_bytes(layers, max(tokens, 1), block_size),
        )
        for name, tokens in p95.items()
    ]
    shared = None
    if (prefix := workload.shared_prefix) is not None:
        shared = SharedPrefixEstimate(
            **prefix.model_dump(),
            num_full_blocks=prefix.num_tokens // block_size,
            shared_bytes_per_request=shared_prefix_bytes(layers, prefix.num_tokens, prefix.num_tokens, block_size),
        )
    estimate = RunEstimate(
        model=spec.name,
        kv_cache_dtype=facts.kv_cache_dtype,
        bytes_per_token=bpt,
        bytes_per_block=bpb,
        block_size=block_size,
        num_blocks=num_blocks,
        pool_tokens=num_blocks * block_size,
        pool_bytes=num_blocks * bpb,
        buckets=buckets,
        shared_prefix=shared,
        plan=[plan_target(workload, i, p95) for i in range(len(workload.plan))],
    )
    return estimate, KVPricing(bpt, facts.block_size, facts.max_model_len, facts.bytes_per_block)


def plan_target(workload: Workload, index: int, p95: dict[str, int]) -> DeploymentEstimate:
    """Size every bucket's P95 request on ``workload.plan[index]`` with kvplan's capacity
    estimate (vLLM defaults: block size 16, 0.9 GPU memory utilization, weights and overhead
    subtracted). ``p95``: bucket name -> P95 request tokens (an empty dict checks the target).

    Raises:
        KvplanError: an unknown model, GPU or KV dtype, a bad tp, or a model that leaves no KV
            budget on that GPU: named ``<workload>: plan[i].<field>``.
    """
    target = workload.plan[index]
    try:
        spec = load_model_spec(workload.resolve_model(target.model))
        sized = {
            name: estimate_capacity(
                spec,
                kv_cache_dtype=target.kv_cache_dtype,
                tp=target.tp,
                gpu=target.gpu,
                weight_dtype=target.weight_dtype,
                max_model_len=max(tokens, 1),
            )
            for name, tokens in (p95 or {"": spec.max_position_embeddings}).items()
        }
    except KvplanError as err:
        at = f"plan[{index}]"
        fix = err.fix  # fixes that name other settings do not apply: a plan entry has its own few fields
        if err.field == "gpu":
            fix = gpu_hint(target.gpu)
        elif err.field == "KV budget":
            fix = "use a larger gpu, a higher tp or a smaller weight_dtype in this plan entry"
        if err.source is not None:  # inside the model's config or GGUF file
            raise KvplanError(f"{at}.model", f"{err.where}: {err.problem}", fix, source=workload.source) from None
        if err.field in _PLAN_FIELDS:
            raise err.within(source=workload.source, prefix=at, fix=fix) from None
        raise KvplanError(at, err.problem, fix, source=workload.source) from None
    first = next(iter(sized.values()))
    return DeploymentEstimate(
        model=target.model,
        gpu=first.gpu,
        tp=target.tp,
        kv_cache_dtype=first.kv_cache_dtype,
        weight_dtype=target.weight_dtype,
        bytes_per_token=first.bytes_per_token,
        num_blocks=first.num_blocks,
        kv_capacity_tokens=first.kv_capacity_tokens,
        buckets=[DeploymentBucket(name=name, max_concurrency=_max_concurrency(c)) for name, c in sized.items() if name],
    )


def _max_concurrency(capacity: Capacity) -> int:
    """Whole P95 requests that fit: a plan entry names a GPU, so the KV budget is known."""
    assert capacity.max_concurrency is not None  # estimate_capacity sets it whenever a GPU is given
    return int(capacity.max_concurrency)
