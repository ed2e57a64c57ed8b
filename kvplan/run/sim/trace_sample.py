"""What a trace bucket's capacity probes run: a bounded, evenly spaced sample of its requests.

A trace bucket's knee and SLO search probes (kvplan.run.sim.search) run at most
kvplan.workload.trace.PROBE_REQUESTS (1,000) of its requests, evenly spaced in arrival order
(position ``j * n // 1000`` of the trace's n, so every stretch of the trace is represented as it
is in the trace), with the bucket's num_requests set to match: a probe costs the same on a trace
of 20,000 requests as on one of 1,000, where before each of a 20,000-request trace's 9 knee probes
ran all 20,000 (docs/benchmarks.md#trace-20k). The answers are those of the sample, said as such
(``kvplan simulate`` prints it; results.json's ``run.dataset.probe_requests``); the replay level
itself (kvplan.run.driver) runs every request of the trace at its own time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvplan.traffic.requests import SampledRequest
from kvplan.workload.schema import Workload
from kvplan.workload.trace import PROBE_REQUESTS


def evenly_spaced(n: int, cap: int) -> list[int]:
    """At most ``cap`` of the positions 0..n-1, evenly spaced: ``j * n // cap`` (all when n <= cap)."""
    return list(range(n)) if n <= cap else [j * n // cap for j in range(cap)]


def probe_sample(
    workload: Workload, sampled: Mapping[str, Sequence[SampledRequest]]
) -> tuple[Workload, Mapping[str, Sequence[SampledRequest]]]:
    """What a trace workload's probes run: each bucket's requests cut to ``PROBE_REQUESTS``, evenly
    spaced in arrival order (``evenly_spaced``), and its num_requests to match; any other workload
    (and a trace of at most that many) as given. Returns (workload, requests by bucket name)."""
    if workload.dataset.kind != "trace":
        return workload, sampled
    cut = {}
    for b in workload.buckets:
        requests = sampled[b.name]
        cut[b.name] = [requests[i] for i in evenly_spaced(len(requests), PROBE_REQUESTS)]
    buckets = [b.model_copy(update={"num_requests": len(cut[b.name])}) for b in workload.buckets]
    return workload.model_copy(update={"buckets": buckets}), cut
