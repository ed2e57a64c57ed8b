"""Per-class statistics of a mixed level (a bucket's ``mix``, kvplan.traffic.mix): pure functions of
its request records.

Every class's latencies are computed exactly as the level's are (kvplan.results.stats.latency), over the
level's measured requests of that class; rates divide by the level's span or measured window, as
the level's do, so the classes' goodputs sum to the level's. A request is judged by its class's SLO
(the workload's, with the class's own limits in their place).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import Field

from kvplan.results.records import RequestRecord
from kvplan.results.stats.latency import (
    LatencyStats,
    Slo,
    _Summary,
    completed,
    e2e_s,
    itls_s,
    latency_stats,
    meets_slo,
    tpot_s,
    ttft_s,
)


class ClassSummary(_Summary):
    """One request class of a mixed level: its measured requests' counts, latency statistics (ms),
    SLO attainment (0..1, of its measured requests) and goodput (requests/s meeting its SLO)."""

    name: str = Field(description="The class's name (its mix entry).")
    num_requests: int = Field(description="The class's measured requests.")
    num_completed: int = Field(description="Of them, completed.")
    ttft_ms: LatencyStats | None = Field(description="TTFT of its completed requests, ms.")
    tpot_ms: LatencyStats | None = Field(description="TPOT, ms.")
    itl_ms: LatencyStats | None = Field(description="ITL, ms.")
    e2e_ms: LatencyStats | None = Field(description="E2E latency, ms.")
    slo_attainment: float | None = Field(description="Fraction of its measured requests meeting its SLO.")
    goodput_rps: float | None = Field(description="Its requests/s meeting its SLO.")
    requests_per_s: float | None = Field(description="Its completed requests/s.")


def class_summaries(
    requests: Sequence[RequestRecord],
    served: Sequence[tuple[RequestRecord, bool]],
    rate: Callable[[int], float | None],
    slo_of: Callable[[RequestRecord], Slo],
) -> list[ClassSummary]:
    """One summary per class, in the order the classes first appear among ``requests`` (the
    level's measured requests); [] for a level without classes. ``served``: the completed requests
    a rate counts (the measured window's, for a steady-state level), each with whether it met its
    SLO; ``rate``: a count -> per second of the level's span."""
    names = list(dict.fromkeys(r.request_class for r in requests if r.request_class))
    out = []
    for name in names:
        own = [r for r in requests if r.request_class == name]
        done = [r for r in own if completed(r)]
        counted = [good for r, good in served if r.request_class == name]
        out.append(
            ClassSummary(
                name=name,
                num_requests=len(own),
                num_completed=len(done),
                ttft_ms=latency_stats([t for r in done if (t := ttft_s(r)) is not None]),
                tpot_ms=latency_stats([t for r in done if (t := tpot_s(r)) is not None]),
                itl_ms=latency_stats(itls_s(done)),
                e2e_ms=latency_stats([e2e_s(r) for r in done]),
                slo_attainment=sum(meets_slo(r, slo_of(r)) for r in own) / len(own),
                goodput_rps=rate(sum(counted)),
                requests_per_s=rate(len(counted)),
            )
        )
    return out
