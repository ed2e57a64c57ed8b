"""The workload's ``engine.admission:``: admission at the engine's entry, for the bundled engine and
``kvplan simulate`` alike (the policy itself is engine.admission's; this is its YAML schema).

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

from pydantic import Field

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
