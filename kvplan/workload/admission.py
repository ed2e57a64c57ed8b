"""The workload's ``engine.admission:``, ``engine.offload:`` and ``engine.disagg:`` sections: admission
at the engine's entry, for the bundled engine and ``kvplan simulate`` alike (the policy itself is
engine.admission's; this is its YAML schema), the bundled engine's KV offload tiers (engine.offload),
and the bundled engine served disaggregated (engine.disagg: x prefill and y decode workers).

::

    engine:
      admission: {max_num_waiting: 8, kv_admission_reserve: 0.1, max_output_tokens: 256,
                  tenant_max_concurrency: 4, tenant_max_waiting: 4}

Every key is off (null) by default, and the engine then runs as it always did. The keys are
EngineConfig's fields and ``python -m engine.serve``'s flags of the same names; a ``--target``
run's admission is the server's own (its flags), so there this section is not sent anywhere. A
request's tenant is its mix class's ``tenant`` (kvplan.workload.request_class), else its shared_prefix
tenant's number; a request with neither is under no per-tenant limit.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ByteSize, Field, field_validator, model_validator

from kvplan.workload.lengths import MAX_BUNDLED_WORKERS, Count, StrictModel, check_pool_workers

Reserve = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]


class AdmissionSettings(StrictModel):
    """Admission at the entry (engine.admission): a queue bound, a KV budget, an output cap and
    per-tenant limits; a refused request finishes as ``rejected`` (HTTP 429 from engine.serve) and
    counts in the level's shed fraction. All null: off."""

    max_num_waiting: Count | None = Field(
        None, description="The most requests queued (waiting, new or preempted); one more is refused; null = no bound."
    )
    kv_admission_reserve: Reserve | None = Field(
        None,
        description="Turns on the KV budget: a request is refused unless the blocks of prompt + max_tokens of the"
        " queued and running requests and its own fit the pool less this fraction (0..1, below 1); with it no"
        " request is ever preempted; null = no KV budget.",
    )
    max_output_tokens: Count | None = Field(
        None,
        description="Every request's max_tokens clamped to at most this, tokens (clamped as vLLM does, never"
        " refused); null = no cap.",
    )
    tenant_max_concurrency: Count | None = Field(
        None,
        description="The most requests of one tenant running at once; its next ones wait while others'"
        " requests behind them may run; null = no limit.",
    )
    tenant_max_waiting: Count | None = Field(
        None, description="The most requests of one tenant queued; one more is refused; null = no limit."
    )

    @property
    def is_on(self) -> bool:
        return any(value is not None for value in self.model_dump().values())


ADMISSION_FIELD = Field(
    AdmissionSettings(),
    description="Admission at the engine's entry: queue bound, KV budget, output cap, per-tenant limits"
    " (kvplan.workload.admission); all off by default.",
)


Gib = Annotated[float, Field(gt=0, lt=2**33, allow_inf_nan=False)]


class OffloadSettings(StrictModel):
    """KV offload tiers of the bundled engine (engine.offload; the policy: docs/architecture.md,
    "KV offload tiers")::

        engine:
          offload: {host_gib: 4, disk_gib: 16, disk_path: /mnt/nvme/kv}

    A cached block the device pool evicts is stored in host memory (then, evicted from there, on
    disk); a prefix lookup that misses the pool loads it back instead of recomputing it. The keys
    are EngineConfig's ``offload_host_gib``, ``offload_disk_gib``, ``offload_disk_path`` and
    ``python -m engine.serve``'s ``--kv-offload-*`` flags. All null: off (the engine as before).
    """

    host_gib: Gib | None = Field(
        None, description="The host-memory tier's size, GiB (at least one KV block); null = no host tier."
    )
    disk_gib: Gib | None = Field(
        None,
        description="The disk tier's size, GiB (at least one KV block; reserved in disk_path at start);"
        " null = no disk tier.",
    )
    disk_path: str | None = Field(
        None, description="An existing writable directory for the disk tier's file (one per engine); needs disk_gib."
    )

    @model_validator(mode="after")
    def _disk_path_with_disk(self) -> OffloadSettings:
        if (self.disk_gib is None) != (self.disk_path is None):
            raise ValueError("give disk_gib and disk_path together (the disk tier's size and its directory)")
        return self

    @property
    def is_on(self) -> bool:
        return self.host_gib is not None or self.disk_gib is not None

    def engine_fields(self) -> dict[str, float | str | None]:
        """EngineConfig's fields of the same settings."""
        return {f"offload_{name}": value for name, value in self.model_dump().items()}


OFFLOAD_FIELD = Field(
    OffloadSettings(),
    description="KV offload tiers of the bundled engine: host memory and disk below the device pool"
    " (kvplan.workload.admission.OffloadSettings); off by default.",
)


class EnginePool(StrictModel):
    """One pool of the bundled engine disaggregated: ``workers`` engines alike, each with the engine
    section's settings and these put over them (null: the engine section's). Names as a ``plan:``
    entry's ``disagg`` pool (kvplan.workload.deployment.DisaggPool) and EngineConfig's fields."""

    workers: Count = Field(
        1,
        description=f"Engines in the pool, each with its own KV pool and scheduler; at most {MAX_BUNDLED_WORKERS}.",
        json_schema_extra={"maximum": MAX_BUNDLED_WORKERS},
    )
    max_num_seqs: Count | None = Field(None, description="Each worker's max_num_seqs; null = the engine section's.")
    max_num_batched_tokens: Count | None = Field(
        None, description="Each worker's token budget per step, tokens; null = the engine section's."
    )
    kv_cache_memory: ByteSize | None = Field(
        None, description="Each worker's KV pool, bytes with units (``48MiB``); null = the engine section's pool."
    )
    num_blocks: Count | None = Field(
        None, description="Each worker's KV pool in blocks, instead of kv_cache_memory; null = the engine section's."
    )

    @field_validator("kv_cache_memory")
    @classmethod
    def _positive(cls, value: ByteSize | None) -> ByteSize | None:
        if value is not None and not 0 < value < 2**63:
            raise ValueError(f"must be > 0 bytes and below 8 EiB (got {int(value)})")
        return value

    @model_validator(mode="after")
    def _one_pool_size(self) -> EnginePool:
        if self.kv_cache_memory is not None and self.num_blocks is not None:
            raise ValueError("give kv_cache_memory or num_blocks, not both")
        return self

    def over(self, engine: dict) -> dict:
        """``engine`` (the engine section's fields, a dict) with this pool's settings put over them."""
        own = self.model_dump(exclude={"workers"}, exclude_none=True)
        if own.keys() & {"kv_cache_memory", "num_blocks"}:
            engine = {**engine, "kv_cache_memory": None, "num_blocks": None}  # one pool size replaces the other
        return {**engine, **own}

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: int) -> int:
        return check_pool_workers(value, bundled=True)


class EngineDisagg(StrictModel):
    """The bundled engine disaggregated (engine.disagg; semantics: docs/simulate.md, "Disaggregated
    targets")::

        engine:
          disagg: {prefill: {workers: 1, max_num_batched_tokens: 512}, decode: {workers: 1, max_num_seqs: 16}}

    ``kvplan loadtest`` runs engine.disagg.inproc.DisaggEngine in process (request i to prefill
    worker i mod x, its KV to decode worker i mod y, copied and timed); ``kvplan simulate`` runs the
    same pools on kvplan.run.sim.disagg, each transfer priced over ``link``. Admission, offload tiers
    and an fp8 KV cache are not supported with it."""

    prefill: EnginePool = Field(default_factory=EnginePool, description="The prefill pool.")
    decode: EnginePool = Field(default_factory=EnginePool, description="The decode pool.")
    link: str | dict[str, float] = Field(
        "host-memcpy",
        description="What ``kvplan simulate`` prices each KV transfer over (kvplan/sizing/data/links.yaml, or"
        " ``{gbps: N, setup_us: N}``); ``host-memcpy``: the in-process copy, measured on this project's CPU.",
    )

    @field_validator("link", mode="before")  # before: a bad gbps named by lookup_link, not as a union
    @classmethod
    def _link(cls, value: str | dict[str, float]) -> str | dict[str, float]:
        from kvplan.errors import KvplanError
        from kvplan.sizing.gpus.links import lookup_link

        try:
            lookup_link(value)
        except KvplanError as err:
            raise ValueError(f"{err.problem}; {err.fix}") from None
        return value


DISAGG_FIELD = Field(
    None,
    description="Run the bundled engine disaggregated: ``{prefill: {workers, max_num_seqs,"
    " max_num_batched_tokens, kv_cache_memory, num_blocks}, decode: {...}, link}``"
    " (kvplan.workload.admission.EngineDisagg); null = one aggregated engine.",
)
