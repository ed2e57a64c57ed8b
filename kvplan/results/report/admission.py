"""The report's admission tables: what was shed per level and per tenant (kvplan.results.stats.shed),
beside the admitted requests' TTFT and the preemptions, the trade admission makes. Absent for a
run in which nothing was refused, no request had a tenant and admission was off.
"""

from __future__ import annotations

import pandas as pd

from kvplan.results import metrics
from kvplan.results.report import tables
from kvplan.results.run_result import RunResult


def _admission_on(result: RunResult) -> bool:
    """Whether the workload's engine section turned admission on (kvplan.workload.admission)."""
    engine = result.workload.config.get("engine")
    admission = engine.get("admission") if isinstance(engine, dict) else None
    return isinstance(admission, dict) and any(v is not None for v in admission.values())


def shown(result: RunResult) -> bool:
    return _admission_on(result) or any(lv.num_rejected or lv.tenants for lv in result.levels)


def shed_table(result: RunResult) -> pd.DataFrame:
    """One row per level: requests, refused, shed %, the reasons, the admitted requests' TTFT P99
    (ms) and the preemptions; empty when ``shown`` is False."""
    if not shown(result):
        return pd.DataFrame()
    rows = [
        {
            "bucket": lv.bucket,
            "level": tables.level_name(lv),
            "requests": lv.num_requests,
            "rejected": lv.num_rejected,
            "shed %": None if lv.shed_fraction is None else round(100 * lv.shed_fraction, 1),
            "reasons": ", ".join(f"{k} {v}" for k, v in lv.rejected_reasons.items()) or "-",
            "TTFT P99 admitted": None if lv.ttft_ms is None else lv.ttft_ms.p99,
            "preempt": metrics.preemptions(lv),
        }
        for lv in result.levels
    ]
    return pd.DataFrame(rows)


def tenant_table(result: RunResult) -> pd.DataFrame:
    """One row per level and tenant: requests, refused, shed %, completed, TTFT P99 (ms)."""
    rows = [
        {
            "bucket": lv.bucket,
            "level": tables.level_name(lv),
            "tenant": t.name,
            "requests": t.num_requests,
            "rejected": t.num_rejected,
            "shed %": round(100 * t.shed_fraction, 1),
            "completed": t.num_completed,
            "TTFT P99": None if t.ttft_ms is None else t.ttft_ms.p99,
        }
        for lv in result.levels
        for t in lv.tenants
    ]
    return pd.DataFrame(rows)


def admission_markdown(result: RunResult) -> list[str]:
    """summary.md's section ([] when ``shown`` is False)."""
    frame = shed_table(result)
    if frame.empty:
        return []
    lines = [
        "",
        "## Admission: shed per level",
        "",
        "Rejected: refused at the entry (the engine's admission, a target's HTTP 429), never run and in no"
        " latency; shed % = rejected / requests. TTFT P99 of the admitted (completed) requests, ms.",
        "",
        tables.to_markdown(frame).rstrip("\n"),
    ]
    per_tenant = tenant_table(result)
    if not per_tenant.empty:
        lines += ["", "## Admission: shed per tenant", "", tables.to_markdown(per_tenant).rstrip("\n")]
    return lines
