"""A workload's ``plan:`` entries: the production targets its buckets are sized on (kvplan
estimate's capacity arithmetic in a load test's report; GPU targets in ``kvplan simulate``), and
the KV dtype validation they share with the ``engine:`` section. An entry with ``disagg:`` is a
disaggregated deployment: a pool of prefill workers and a pool of decode workers joined by a link
(docs/simulate.md, "Disaggregated targets").
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from kvplan.errors import KvplanError
from kvplan.sizing import dtypes
from kvplan.workload.buckets import Count, StrictModel
from kvplan.workload.lengths import MAX_POOL_WORKERS, check_pool_workers


def kv_cache_dtype_value(value: Any, allowed: tuple[str, ...]) -> Any:
    """kvplan's name for a KV dtype (bfloat16 -> bf16), as a pydantic validator: ValueError
    naming the choices for an unknown one."""
    if not isinstance(value, str):
        return value  # strict str validation reports it
    try:
        return dtypes.canonical(value, allowed=allowed)
    except KvplanError as err:
        raise ValueError(f"{err.problem}; {err.fix}") from None


class DisaggPool(StrictModel):
    """One pool of a disaggregated deployment: ``workers`` engines alike, each on ``tp x dp`` GPUs
    (experts split ``ep`` ways, attention data parallel ``dp``) with its own KV pool and scheduler
    limits (null: the plan entry's tp, ep and dp, the engine section's limits)."""

    workers: Count = Field(
        1,
        description=f"Engines in the pool, each with its own KV pool and scheduler; at most {MAX_POOL_WORKERS}.",
        json_schema_extra={"maximum": MAX_POOL_WORKERS},
    )
    tp: Count | None = Field(
        None, description="Tensor parallelism of each worker of the pool; null = the plan entry's ``tp``."
    )
    ep: Count | None = Field(
        None, description="Expert-parallel size of each worker of the pool (MoE); null = the plan entry's ``ep``."
    )
    dp: Count | None = Field(
        None,
        description="Attention data-parallel size of each worker of the pool (MoE; a worker is tp x dp GPUs);"
        " null = the plan entry's ``dp``.",
    )
    max_num_seqs: Count | None = Field(None, description="Each worker's max_num_seqs; null = the engine section's.")
    max_num_batched_tokens: Count | None = Field(
        None, description="Each worker's token budget per step; null = the engine section's."
    )

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: int) -> int:
        return check_pool_workers(value)


class Disagg(StrictModel):
    """Prefill/decode disaggregation of a plan entry: ``prefill`` workers compute each prompt's KV
    and its first token, the KV moves over ``link`` to one of the ``decode`` workers, which
    generates the rest (DISAGG semantics: docs/simulate.md)."""

    prefill: DisaggPool = Field(default_factory=DisaggPool, description="The prefill pool.")
    decode: DisaggPool = Field(default_factory=DisaggPool, description="The decode pool.")
    link: str | dict[str, float] = Field(
        "rdma-400g",
        description="The link the KV moves over, by name (kvplan/sizing/data/links.yaml: ``nvlink``, ``pcie5``,"
        " ``rdma-400g``, ...) or as ``{gbps: N, setup_us: N}`` (10**9 bytes/s one way, microseconds).",
    )

    first_token: Literal["prefill", "decode"] = Field(
        "prefill",
        description="Where the client's first token comes from: ``prefill`` (the bundled router streams the"
        " prefill worker's token at once) or ``decode`` (vLLM's disaggregated proxies: the prefill answer is"
        " dropped and every token the client sees comes from the decode worker, the first after the KV has"
        " moved and one decode step).",
    )

    @field_validator("link", mode="before")  # before: a bad gbps named by lookup_link, not as a union
    @classmethod
    def _link(cls, value: Any) -> Any:
        from kvplan.sizing.gpus.links import lookup_link

        try:
            lookup_link(value)
        except KvplanError as err:
            raise ValueError(f"{err.problem}; {err.fix}") from None
        return value


class Deployment(StrictModel):
    """A production target to size the buckets on: a model preset, a GPU, tensor parallelism,
    a KV cache and a weight dtype (names as in ``kvplan estimate``; ``auto``: the checkpoint's),
    and for ``kvplan simulate``'s step times the expert-parallel size and the serving backend.
    ``kv_dtype`` is the deprecated name of ``kv_cache_dtype``."""

    model_config = ConfigDict(
        json_schema_extra=lambda schema, _: schema["properties"].update(
            kv_dtype={
                "type": "string",
                "deprecated": True,
                "description": "Old name of kv_cache_dtype, still read, with a warning.",
            }
        )
    )

    model: str = Field(
        description="The production model: a preset name as in ``kvplan estimate`` (``llama-3.1-8b``) or the"
        " Hugging Face id it aliases, or a config.json or GGUF file, a relative path read from the workload"
        " file's folder."
    )
    gpu: str = Field(description="The production GPU, by kvplan's name for it (``L4``, ``H100-SXM``, ...).")
    tp: Count = Field(
        1,
        description="Tensor parallelism: the GPUs the model is split over, each holding its share of the KV"
        " heads (KV bytes per token per GPU rank).",
    )
    kv_cache_dtype: str = Field(
        "auto",
        description="The KV cache dtype on the target: ``auto`` = the checkpoint's serving dtype, or"
        " ``bf16``, ``fp16``, ``fp32``, ``fp8``, ``int8``, ``int4`` (torch's names read too).",
    )
    weight_dtype: str = Field(
        "auto",
        description="The weights' dtype on the target: ``auto`` = the checkpoint's own, or ``bf16``, ``fp16``,"
        " ``fp8``, ``int8``, ``int4``, ``nvfp4`` (alias ``fp4``), ``mxfp4`` (what the weights leave of the"
        " GPU's memory is the KV budget).",
    )
    ep: Count = Field(
        1,
        description="Expert-parallel size of a MoE model: its experts split ``ep`` ways, each ``tp / ep`` ways"
        " (``kvplan simulate``'s step times; the KV pool is the same).",
    )
    dp: Count = Field(
        1,
        description="Attention data parallelism of a MoE model: each engine instance is ``tp x dp`` GPUs, its"
        " attention ``dp`` independent batches (each DP rank its own KV pool and the engine section's limits),"
        " its experts over all ``tp x dp`` GPUs (``kvplan simulate``; docs/simulate.md).",
    )
    backend: str = Field(
        "vllm",
        description="The serving engine whose measured operation times (aiconfigurator-core) time this"
        " target's steps in ``kvplan simulate``: ``vllm``, ``sglang``, ``trtllm``.",
    )
    backend_version: str | None = Field(
        None,
        description="The ``backend``'s database version (default: the one aiconfigurator-core maintains as"
        " current for the GPU).",
    )
    moe_kernel: str = Field(
        "auto",
        description="The MoE expert kernel the steps are timed with: ``auto`` (the database's own) or ``marlin``"
        " (MXFP4 experts on Marlin's W4A16 kernels, as vLLM runs them with ``VLLM_MXFP4_USE_MARLIN=1``;"
        " docs/simulate.md).",
    )
    tokenize_us_per_token: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="The server's tokenizer thread, us per prompt token, for clients that send text prompts:"
        " each request queues for it, first in first out, after a 2 ms wait, before the scheduler's queue"
        " (vLLM's AsyncMicrobatchTokenizer; 3.3 measured on the o200k vocabulary, docs/simulate.md); 0: none."
        " Not simulated on a disaggregated entry.",
    )

    disagg: Disagg | None = Field(
        None,
        description="Serve this target disaggregated: ``{prefill: {workers, tp, ep, dp, max_num_seqs,"
        " max_num_batched_tokens}, decode: {...}, link, first_token}``; null = aggregated replicas.",
    )

    @field_validator("weight_dtype", mode="before")
    @classmethod
    def _weight_dtype(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value  # strict str validation reports it
        try:
            return dtypes.canonical_weight(value)
        except KvplanError as err:
            raise ValueError(f"{err.problem}; {err.fix}") from None

    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, value: Any) -> Any:
        from kvplan.sizing.gpus.silicon import BACKENDS

        name = str(value).strip().lower()
        if name not in BACKENDS:
            raise ValueError(f"unknown backend {value!r}; use one of {', '.join(BACKENDS)}")
        return name

    @field_validator("moe_kernel", mode="before")
    @classmethod
    def _moe_kernel(cls, value: Any) -> Any:
        from kvplan.sizing.gpus.silicon_marlin import MOE_KERNELS

        if str(value) not in MOE_KERNELS:
            raise ValueError(f"unknown MoE kernel {value!r}; use one of {', '.join(MOE_KERNELS)}")
        return str(value)

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kv_dtype" in data:
            if "kv_cache_dtype" in data:
                raise ValueError("give kv_cache_dtype only (kv_dtype is its deprecated name)")
            data = {("kv_cache_dtype" if k == "kv_dtype" else k): v for k, v in data.items()}
        return data

    @field_validator("kv_cache_dtype", mode="before")
    @classmethod
    def _kv_dtype(cls, value: Any) -> Any:
        return kv_cache_dtype_value(value, tuple(dtypes.DTYPES))
