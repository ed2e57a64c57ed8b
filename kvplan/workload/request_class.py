"""A bucket's request classes (``mix:``) and engine variants (``variants:``): their schema.

What they do: kvplan.traffic.mix (classes drawn by weight into one stream) and kvplan.workload.variants
(every level once per variant).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from kvplan.results.metrics import Slo
from kvplan.workload.lengths import Lengths, Name, StrictModel


class RequestClass(StrictModel):
    """One class of a bucket's ``mix``: its share of the requests (``weight``), its own token-length
    ranges and optionally its own SLO. The classes are drawn by weight into one seeded stream, so
    a level runs them together, in one batch, as production traffic does."""

    name: Name = Field(
        description="The class's name, unique in its bucket (letters, digits and ``_.-``), as reports and"
        " requests.csv's ``request_class`` column show it."
    )
    weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        description="The class's share of the bucket's requests, relative to the other classes' weights (they"
        " need not sum to 1; their sum must be above 0; 0 leaves the class out)."
    )
    input_tokens: Lengths = Field(
        description="The class's prompt length range, tokens, as a bucket's ``input_tokens``."
    )
    output_tokens: Lengths = Field(
        description="The class's output length range, tokens, as a bucket's ``output_tokens``."
    )
    slo: Slo | None = Field(
        None,
        description="The class's own latency limits, ms; each limit given replaces the workload's ``slo``"
        " one for this class's requests (the others stay the workload's); null = the workload's.",
    )
    tenant: Name | None = Field(
        None,
        description="The tenant the class's requests come from (several classes may name one): what"
        " ``engine.admission``'s per-tenant limits count and the report's shed fraction per tenant groups"
        " by; sent to a ``--target`` as the body's ``user``; null = none.",
    )


class Variant(StrictModel):
    """One engine variant (kvplan.workload.variants): every level runs once per variant, with the same
    requests, on the workload's engine with these settings changed. ``engine`` takes the keys of
    the workload's ``engine:`` section (``model`` excepted: the requests are the same token ids)."""

    name: Name = Field(
        description="The variant's name (letters, digits and ``_.-``), as level labels (``c=8 chunk-256``),"
        " the gate's baseline keys and the report show it; not ``cached``/``uncached``."
    )
    engine: dict[str, Any] = Field(
        {},
        description="The engine settings this variant changes, keys and values as in the workload's"
        " ``engine:`` (``{max_num_batched_tokens: 256}``); {} = the workload's engine as it is. A"
        " ``--target`` run cannot change the server's engine and refuses a variant that does.",
    )
