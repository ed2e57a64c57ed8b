"""``kvplan plan --disagg``: disaggregated units beside the aggregated replicas, and the verdict.

A unit is ``x`` prefill workers of tp ``t_p`` and ``y`` decode workers of tp ``t_d`` joined by a
link (docs/simulate.md, "Disaggregated targets"), each pool with its own ``max_num_seqs`` and
``max_num_batched_tokens``. It is judged like a replica (kvplan.optimize.plan.judge: the capacity
search of ``kvplan simulate``, on kvplan.run.sim.disagg's two pools) and costed with the unit as
the replica: GPUs = replicas x (x t_p + y t_d).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import product
from typing import TYPE_CHECKING, Any

from kvplan.errors import KvplanError

if TYPE_CHECKING:
    from kvplan.results.plan_result import ConfigResult
    from kvplan.workload.deployment import Deployment


def disagg_grid(
    base: Sequence[Any],
    pools: dict[str, Sequence[int]],
    links: Sequence[str],
    max_gpus: int,
) -> list[Any]:
    """Every unit (a kvplan.optimize.plan.Config: that module imports this one) built from
    ``base``'s GPUs, dtypes and limits (the limits become the decode
    pool's): ``pools`` maps ``prefill_tp``, ``tp`` (decode), ``prefill_workers``, ``decode_workers``,
    ``prefill_max_num_seqs`` and ``prefill_max_num_batched_tokens`` to the values to try; every
    combination with each link, at most ``max_gpus`` GPUs in a unit, in the order given."""
    keys = (
        "prefill_tp",
        "tp",
        "prefill_workers",
        "decode_workers",
        "prefill_max_num_seqs",
        "prefill_max_num_batched_tokens",
    )
    units = [
        replace(c, link=link, **dict(zip(keys, values, strict=True)))
        for c in {replace(c, tp=0): None for c in base}  # base without its tp: each GPU/dtype/limit once
        for values in product(*(pools[k] for k in keys))
        for link in links
    ]
    return [u for u in units if u.num_gpus <= max_gpus]


def check_pool_tps(model_dir: str, tps: Sequence[int], field: str, strict: bool = True) -> list[int]:
    """The tps of ``tps`` that can shard ``model_dir``'s attention (kvplan.sizing.kv_math.kv_heads_per_rank),
    in order; with ``strict``, all of them or an error.

    Raises:
        KvplanError: ``field``: with ``strict``, a tp that does not divide the attention heads (or
            the KV heads); the model's config unreadable (as kvplan estimate says it).
    """
    from kvplan.sizing.kv_math import kv_heads_per_rank
    from kvplan.sizing.models.model_source import load_model_config
    from kvplan.sizing.models.model_spec import ModelSpec

    spec = ModelSpec.from_hf_config(*load_model_config(model_dir)[:2])
    fit = []
    for tp in tps:
        try:
            kv_heads_per_rank(spec.num_kv_heads, spec.num_attention_heads, tp)
        except KvplanError as err:
            if strict:
                raise KvplanError(field, err.problem, err.fix) from None
            continue
        fit.append(tp)
    return fit


def unit(model: str, c: Any) -> Deployment:
    """kvplan.optimize.plan.Config ``c`` (a unit) as a ``plan:`` entry of ``kvplan simulate``."""
    from kvplan.workload.deployment import Deployment, Disagg, DisaggPool

    pools = Disagg(
        prefill=DisaggPool(
            workers=c.prefill_workers,
            tp=c.prefill_tp,
            max_num_seqs=c.prefill_max_num_seqs,
            max_num_batched_tokens=c.prefill_max_num_batched_tokens,
        ),
        decode=DisaggPool(
            workers=c.decode_workers,
            tp=c.tp,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
        ),
        link=c.link,
    )
    return Deployment(
        model=model, gpu=c.gpu, tp=c.tp, kv_cache_dtype=c.kv_cache_dtype, weight_dtype=c.weight_dtype, disagg=pools
    )


def disagg_verdict(ranked: Sequence[ConfigResult]) -> str | None:
    """Whether disaggregation pays on this load: the first disaggregated unit and the first
    aggregated replica meeting the SLO in the ranking (kvplan.optimize.plan.rank_key). It pays when
    the unit's deployment costs less per hour (unpriced: needs fewer GPUs), breaks even at the same
    cost, else does not pay. Why: what each costs, the GPUs the unit adds (or saves), its SLO
    capacity per GPU, and the TTFT and TPOT P99 at the capacity point each is sized at (a long
    prefill in a decode step stretches every running request's TPOT and the TTFT of those behind
    it; a unit keeps prefills out of the decode steps but pays a transfer and two pools); None
    without disaggregated configurations."""
    if not any(r.disagg for r in ranked):
        return None
    dis = next((r for r in ranked if r.disagg and r.meets_slo), None)
    agg = next((r for r in ranked if not r.disagg and r.meets_slo), None)
    if dis is None:
        return "disaggregation does not pay: no disaggregated configuration meets the SLO at this load"
    if agg is None:
        return f"disaggregation pays: {_said(dis)}; no aggregated configuration meets the SLO at this load"
    verb = pays(dis, agg)
    assert dis.num_gpus is not None and agg.num_gpus is not None  # both meet the SLO
    more = dis.num_gpus - agg.num_gpus
    gpus = f"{more} GPU(s) more" if more > 0 else f"{-more} GPU(s) fewer" if more < 0 else "as many GPUs"
    return f"disaggregation {verb}: {_said(dis)} against aggregated {_said(agg)}: {gpus}"


def pays(option: ConfigResult, other: ConfigResult) -> str:
    """ "pays", "breaks even" or "does not pay": whether ``option``'s deployment costs less per hour
    than ``other``'s (both meeting the SLO; either unpriced: by GPU count)."""
    assert option.num_gpus is not None and other.num_gpus is not None  # both meet the SLO
    cost: tuple[float, float] = (option.num_gpus, other.num_gpus)
    if option.usd_per_hour is not None and other.usd_per_hour is not None:
        cost = (option.usd_per_hour, other.usd_per_hour)
    return "pays" if cost[0] < cost[1] else "breaks even" if cost[0] == cost[1] else "does not pay"


def _said(r: ConfigResult) -> str:
    what = f"{r.gpu} {r.disagg}" if r.disagg else f"{r.gpu} x{r.tp}"
    usd = "unpriced" if r.usd_per_hour is None else f"${r.usd_per_hour:,.2f}/h"
    unit = "req/s" if r.slo_max_request_rate is not None else "users"
    capacity = r.slo_max_request_rate if r.slo_max_request_rate is not None else r.slo_max_concurrency
    per_gpu = f", {(capacity or 0) / r.num_gpus_per_replica:.3g} {unit} per GPU"
    tails = [
        f"{name} P99 {v:,.0f} ms" for name, v in (("TTFT", r.ttft_p99_ms), ("TPOT", r.tpot_p99_ms)) if v is not None
    ]
    at = f"; at capacity {', '.join(tails)}" if tails else ""
    return f"{what} x{r.replicas} ({r.num_gpus} GPUs, {usd}{per_gpu}{at})"
