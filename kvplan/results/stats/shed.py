"""What admission shed: the refused requests of a level, by reason and by tenant; pure functions of
its request records.

A request is *rejected* when the engine's admission refused it at the entry (finish_reason
``rejected``, engine.admission: ``queue_full``, ``tenant_waiting``, ``kv_budget``) or, for a
``--target``, when the server answered HTTP 429 (its reason the start of the 429's message). The
shed fraction is rejected / requests, over the level's measured requests (0..1); a rejected
request is neither completed nor failed, and has no latency::

    shed fraction = num_rejected / num_requests          per level, and per tenant over its own
    admitted      = num_requests - num_rejected
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from kvplan.results.records import RequestRecord
from kvplan.results.stats.latency import LatencyStats, _Summary, completed, latency_stats, ttft_s

REJECTED = "rejected"  # engine.request.FinishReason.REJECTED, a target's 429 too


def is_rejected(r: RequestRecord) -> bool:
    return r.finish_reason == REJECTED


def reason_of(detail: str) -> str:
    """The reason code a rejection's detail starts with (``kv_budget: ...`` -> ``kv_budget``;
    engine.admission.reason_of, restated: results never import the engine)."""
    return detail.split(":", 1)[0].strip() or "unknown"


class TenantShed(_Summary):
    """One tenant's requests in a level: how many came, were refused and completed, and the TTFT
    of its completed ones."""

    name: str = Field(description="The tenant (a mix class's tenant, a shared_prefix tenant's number).")
    num_requests: int = Field(description="Its measured requests.")
    num_rejected: int = Field(description="Of them, refused at the entry (admission; a target's HTTP 429).")
    shed_fraction: float = Field(description="num_rejected / num_requests, 0..1.")
    num_completed: int = Field(description="Of them, completed.")
    ttft_ms: LatencyStats | None = Field(description="TTFT of its completed requests, ms.")


TENANT_COLUMNS = ("tenant_ids", "tenant_num_running", "tenant_num_waiting")  # StepRecord's, in steps.jsonl


def tenant_step_cells(step: Any) -> dict[str, int]:
    """steps.csv's per-tenant columns of one step (admission on): ``running[<tenant>]`` and
    ``waiting[<tenant>]``, that tenant's running and waiting requests after the step; a tenant
    absent from a step had none (write it as 0)."""
    cells = {}
    for name, running, waiting in zip(step.tenant_ids, step.tenant_num_running, step.tenant_num_waiting):
        cells[f"running[{name}]"], cells[f"waiting[{name}]"] = running, waiting
    return cells


def shed_fields(requests: Sequence[RequestRecord]) -> dict[str, Any]:
    """LevelSummary's admission fields over a level's measured ``requests``: ``num_rejected``,
    ``shed_fraction`` (None without requests), ``rejected_reasons`` (reason -> count, sorted)
    and ``tenants`` (one TenantShed per tenant, by name; [] when no request has a tenant)."""
    rejected = [r for r in requests if is_rejected(r)]
    reasons = [reason_of(r.finish_detail) for r in rejected]
    tenants = []
    for name in sorted({r.tenant_name for r in requests if r.tenant_name is not None}):
        own = [r for r in requests if r.tenant_name == name]
        done = [r for r in own if completed(r)]
        num_rejected = sum(map(is_rejected, own))
        tenants.append(
            TenantShed(
                name=name,
                num_requests=len(own),
                num_rejected=num_rejected,
                shed_fraction=num_rejected / len(own),
                num_completed=len(done),
                ttft_ms=latency_stats([t for r in done if (t := ttft_s(r)) is not None]),
            )
        )
    return {
        "num_rejected": len(rejected),
        "shed_fraction": len(rejected) / len(requests) if requests else None,
        "rejected_reasons": {reason: reasons.count(reason) for reason in sorted(set(reasons))},
        "tenants": tenants,
    }
