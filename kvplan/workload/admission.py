"""The workload's ``engine.admission:`` and ``engine.offload:`` sections: admission at the engine's
entry, for the bundled engine and ``kvplan simulate`` alike (the policy itself is engine.admission's;
this is its YAML schema), and the bundled engine's KV offload tiers (engine.offload).

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

from pydantic import Field, model_validator

from kvplan.workload.lengths import Count, StrictModel

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
