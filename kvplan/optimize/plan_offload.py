"""``kvplan plan --host-offload-gib``: host memory as a dimension of a replica's configuration.

A host KV tier (the bundled engine's ``engine.offload.host_gib``, vLLM's CPU offloading connector,
LMCache's CPU tier) keeps the prefix-cache blocks the device pool evicts in host memory; a later
prefix hit loads them back over the GPU's host link instead of recomputing them. It pays where
prefixes come back after the device pool has let them go and a load costs less than the prefill
it saves; it costs nothing per GPU-hour here (host memory comes with the GPU's price) but GPUs'
hosts hold a bounded amount of it, which the user states by the sizes given.

Each aggregated configuration is judged once per size (0: no tier), by kvplan simulate's tiers
(kvplan.run.sim: capacities in the target's blocks, loads priced setup + bytes / bandwidth over
the system's ``host_link``). Disaggregated units run without tiers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from kvplan.errors import KvplanError
from kvplan.optimize.plan import Config
from kvplan.optimize.plan_disagg import pays
from kvplan.results.plan_result import ConfigResult


def check_sizes(sizes: Sequence[float]) -> list[float]:
    """``sizes`` (GiB of host memory per replica, 0: no tier), each once, in the order given.

    Raises:
        KvplanError: ``host_offload_gib``: none given, or one negative or not finite.
    """
    if not sizes or any(not (math.isfinite(g) and g >= 0) for g in sizes):
        got = ",".join(f"{g:g}" for g in sizes) or "none"
        raise KvplanError("host_offload_gib", f"must be GiB >= 0 (got {got})", "e.g. 0,64,256 (0: no host tier)")
    return list(dict.fromkeys(float(g) for g in sizes))


def with_host_tiers(configs: Sequence[Config], sizes: Sequence[float]) -> list[Config]:
    """Every aggregated configuration of ``configs`` once per size (``sizes`` from check_sizes),
    size by size; disaggregated units (no tiers) once, as they are."""
    replicas = [c for c in configs if not c.prefill_workers]
    units = [c for c in configs if c.prefill_workers]
    return [replace(c, host_offload_gib=g) for g in sizes for c in replicas] + units


def offload_verdict(ranked: Sequence[ConfigResult]) -> str | None:
    """Whether a host KV tier pays on this load: the first aggregated configuration with a tier and
    the first without one meeting the SLO in the ranking (kvplan.optimize.plan.rank_key). It pays
    when the tiered deployment costs less per hour (unpriced: needs fewer GPUs), breaks even at the
    same cost, else does not pay; why: each one's replicas, GPUs, SLO capacity per replica and TTFT
    P99 at its capacity point. None when no configuration has a tier."""
    replicas = [r for r in ranked if not r.disagg]
    if not any(r.host_offload_gib for r in replicas):
        return None
    tiered = next((r for r in replicas if r.host_offload_gib and r.meets_slo), None)
    plain = next((r for r in replicas if not r.host_offload_gib and r.meets_slo), None)
    if tiered is None:
        return "host offload does not pay: no configuration with a host tier meets the SLO at this load"
    if plain is None:
        return f"host offload pays: {_said(tiered)}; none without a host tier meets the SLO at this load"
    verb = pays(tiered, plain)
    assert tiered.num_gpus is not None and plain.num_gpus is not None  # both meet the SLO
    fewer = plain.num_gpus - tiered.num_gpus
    gpus = f"{fewer} GPU(s) fewer" if fewer > 0 else f"{-fewer} GPU(s) more" if fewer < 0 else "as many GPUs"
    return f"host offload {verb}: {_said(tiered)} against no host tier {_said(plain)}: {gpus}"


def _said(r: ConfigResult) -> str:
    host = f" + {r.host_offload_gib:g} GiB host tier" if r.host_offload_gib else ""
    usd = "unpriced" if r.usd_per_hour is None else f"${r.usd_per_hour:,.2f}/h"
    unit = "req/s" if r.slo_max_request_rate is not None else "users"
    capacity = r.slo_max_request_rate if r.slo_max_request_rate is not None else r.slo_max_concurrency
    ttft = "" if r.ttft_p99_ms is None else f", TTFT P99 {r.ttft_p99_ms:,.0f} ms at capacity"
    return f"{r.gpu} x{r.tp}{host} x{r.replicas} ({r.num_gpus} GPUs, {usd}, {capacity:g} {unit} per replica{ttft})"
