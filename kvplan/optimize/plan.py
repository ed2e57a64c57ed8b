"""``kvplan plan``: the cheapest deployment that serves a load of this traffic within the SLO.

Every configuration of the grid (GPU x tensor parallelism x KV dtype x weight dtype x
``max_num_seqs`` x ``max_num_batched_tokens``) is judged on the workload's bucket, the same sampled
requests for all::

    feasible?     the weights, activations and KV fit (kvplan.run.sim.gpu_target.gpu_setup, the
                  capacity arithmetic of kvplan estimate) and every request fits the KV pool
    per replica   the SLO capacity search (kvplan.run.sim.search): the highest request rate
                  (``--rate``) or number of users (``--users``) at which the attainment target of
                  requests meet every SLO, timed by measured silicon where covered, else the roofline
    replicas      ceil(load / per-replica capacity); GPUs = replicas x tp
    cost          $/hour = GPUs x the GPU's on-demand $/GPU-hour (kvplan.sizing.gpus.prices); $ per 1M output
                  tokens = $/hour / (rate x mean output tokens x 3,600 / 1e6); $ per 1,000 good
                  requests = $/hour / (rate x the attainment at the capacity point x 3,600 / 1,000);
                  with --users, rate = users x the capacity point's requests/s per user

With ``--host-offload-gib``, every replica configuration is judged with each host KV tier size
given (``engine.offload.host_gib`` per replica, simulated with the engine's tier policy and loads
priced over the GPU's host link; kvplan.optimize.plan_offload says whether a tier pays).

With ``--disagg``, disaggregated units join the grid (kvplan.optimize.plan_disagg): ``x`` prefill
workers of tp ``t_p`` and ``y`` decode workers of tp ``t_d`` over a link, each pool with its own
limits, judged on kvplan.run.sim.disagg's pools and costed the same way with the unit as the
replica: GPUs = replicas x (x t_p + y t_d).

Configurations are independent: they run here, on a process pool (``jobs``) or as Ray tasks
(kvplan.optimize.plan_pool), each simulated whole in one worker, so the answers do not depend on
where they ran. Ranked: meeting the SLO first, then priced ones
by $/hour, then by GPU count (an unpriced GPU ranks by GPU count, and says so).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product

from kvplan.errors import KvplanError
from kvplan.results.plan_result import ConfigResult
from kvplan.run.checks import check_requests_fit
from kvplan.traffic.requests import SampledRequest
from kvplan.workload.schema import Workload

DEFAULT_GPUS = ("H100-SXM", "H200", "B200", "A100-80GB", "L40S", "L4")  # data-centre GPUs with speed figures
DEFAULT_TP = (1, 2, 4, 8)
RATE_MODE_CONCURRENCY_PRECISION = 1.1  # with --rate, slo_max_concurrency is a lower bound within 10 %


@dataclass(frozen=True)
class Config:
    """One deployment to judge: a replica of ``tp`` GPUs ``gpu`` with these dtypes and limits; with
    ``prefill_workers`` > 0 a disaggregated unit instead: that many prefill workers of
    ``prefill_tp`` GPUs and ``decode_workers`` of ``tp`` GPUs over ``link``."""

    gpu: str
    tp: int
    kv_cache_dtype: str
    weight_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    prefill_workers: int = 0  # 0: aggregated; else a disaggregated unit, whose decode pool has the fields above
    prefill_tp: int = 0
    decode_workers: int = 0
    link: str = ""
    prefill_max_num_seqs: int = 0
    prefill_max_num_batched_tokens: int = 0
    host_offload_gib: float = 0.0  # a replica's host KV tier (engine.offload.host_gib); 0: none

    @property
    def num_gpus(self) -> int:
        """GPUs of one replica (a disaggregated unit: both pools)."""
        if not self.prefill_workers:
            return self.tp
        return self.prefill_workers * self.prefill_tp + self.decode_workers * self.tp

    @property
    def shape(self) -> str | None:
        """``2P tp2 + 3D tp4 over rdma-400g`` for a disaggregated unit (kvplan.run.sim.gpu_target.disagg_setup's
        name for it), None for a replica."""
        if not self.prefill_workers:
            return None
        return f"{self.prefill_workers}P tp{self.prefill_tp} + {self.decode_workers}D tp{self.tp} over {self.link}"


def disagg_fields(c: Config) -> dict:
    """ConfigResult's keys of a disaggregated unit (all None for a replica)."""
    dis = bool(c.prefill_workers)
    return dict(
        disagg=c.shape,
        prefill_workers=c.prefill_workers if dis else None,
        prefill_tp=c.prefill_tp if dis else None,
        decode_workers=c.decode_workers if dis else None,
        link=c.link if dis else None,
        prefill_max_num_seqs=c.prefill_max_num_seqs if dis else None,
        prefill_max_num_batched_tokens=c.prefill_max_num_batched_tokens if dis else None,
    )


def grid(
    gpus: Sequence[str],
    tps: Sequence[int],
    kv_cache_dtypes: Sequence[str],
    weight_dtypes: Sequence[str],
    max_num_seqs: Sequence[int],
    max_num_batched_tokens: Sequence[int],
    max_gpus: int,
) -> list[Config]:
    """Every combination with tp <= ``max_gpus`` (GPUs per replica), in the order given."""
    return [
        Config(g, t, k, w, s, b)
        for g, t, k, w, s, b in product(gpus, tps, kv_cache_dtypes, weight_dtypes, max_num_seqs, max_num_batched_tokens)
        if t <= max_gpus
    ]


@dataclass(frozen=True)
class Job:
    """What a worker needs to judge one configuration (picklable)."""

    workload: Workload
    model: str
    bucket: int
    config: Config
    sampled: Mapping[str, list[SampledRequest]]  # by bucket name (a trace window's: built when read)
    rate: float | None
    users: int | None
    attainment: float
    price: tuple[float, str] | None  # $/GPU-hour and its source


def judge(job: Job) -> ConfigResult:
    """One configuration's answer (see the module docstring); never raises for a configuration that
    cannot run: it comes back infeasible, with the reason."""
    from kvplan.optimize.plan_disagg import unit
    from kvplan.run.sim.brackets import round_rate
    from kvplan.run.sim.gpu_target import disagg_setup, gpu_setup
    from kvplan.run.sim.search import CONCURRENCY_PRECISION, search_capacity

    c = job.config
    limits: dict = {"max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.max_num_batched_tokens}
    if c.host_offload_gib:  # the tier kvplan simulate runs for engine.offload.host_gib (kvplan.run.sim.facts)
        offload = job.workload.engine.offload.model_copy(update={"host_gib": c.host_offload_gib})
        limits["offload"] = offload
    engine = job.workload.engine.model_copy(update=limits)
    bucket = job.workload.buckets[job.bucket]
    workload = job.workload.model_copy(update={"engine": engine, "buckets": [bucket], "plan": []})
    base = dict(
        gpu=c.gpu,
        tp=c.tp,
        num_gpus_per_replica=c.num_gpus,
        **disagg_fields(c),
        kv_cache_dtype=c.kv_cache_dtype,
        weight_dtype=c.weight_dtype,
        max_num_seqs=c.max_num_seqs,
        max_num_batched_tokens=c.max_num_batched_tokens,
        host_offload_gib=c.host_offload_gib or None,
        cost_source=None if job.price is None else job.price[1],
    )
    empty = dict(
        replicas=None,
        num_gpus=None,
        slo_max_request_rate=None,
        slo_max_concurrency=None,
        usd_per_hour=None,
        usd_per_m_output_tokens=None,
        usd_per_k_good_requests=None,
        meets_slo=False,
    )
    try:
        if c.prefill_workers:
            setup = disagg_setup(workload, unit(job.model, c), "config")
        else:
            setup = gpu_setup(workload, job.model, c.gpu, c.tp, c.kv_cache_dtype, c.weight_dtype)
        sampled = {bucket.name: job.sampled[bucket.name]}
        check_requests_fit(workload, setup.facts, sampled)
    except KvplanError as err:
        return ConfigResult(**base, **empty, feasible=False, reason=f"{err.field}: {err.problem}", step_times="")
    # --rate: replicas come from the rate (to within 2 %); the concurrency, only the Pareto point's,
    # to within RATE_MODE_CONCURRENCY_PRECISION. --users: replicas come from it, to within 2 %.
    precision = RATE_MODE_CONCURRENCY_PRECISION if job.rate is not None else CONCURRENCY_PRECISION
    # on exactly the requests the job gives (a trace window's judged ones: --window-requests), unsampled
    cap = search_capacity(
        workload,
        setup.facts,
        sampled,
        setup.clock,
        job.attainment,
        {},
        precision,
        make_backend=setup.make_backend,
        trace_sample=False,
    )[0]
    rate_point = cap.max_request_rate
    if cap.burst_meets_slo and cap.max_concurrency is not None:
        # a TPOT-only SLO holds at any rate (a queue never breaks it): a replica then serves what
        # max_num_seqs in flight serve, its saturation rate (requests/s = goodput / attainment)
        rate_point = cap.max_concurrency
        done = (rate_point.goodput_rps or 0.0) / (rate_point.slo_attainment or 1.0)
        rate_point = rate_point.model_copy(update={"level": round_rate(done)}) if done else None
    rate = None if rate_point is None else float(rate_point.level)
    users = None if cap.max_concurrency is None else int(cap.max_concurrency.level)
    per_replica = rate if job.rate is not None else users
    load = job.rate if job.rate is not None else job.users
    assert load is not None  # the CLI gives one of rate and users
    if not per_replica:
        why = "no level meets the SLO at the attainment target, even one request at a time"
        return ConfigResult(
            **base,
            **{**empty, "slo_max_request_rate": rate, "slo_max_concurrency": users},
            feasible=True,
            reason=why,
            step_times=setup.cost_model.step_times,
        )
    replicas = math.ceil(load / per_replica - 1e-9)
    gpus = replicas * c.num_gpus
    point = rate_point if job.rate is not None else cap.max_concurrency
    assert point is not None  # per_replica is its level
    attained = point.slo_attainment or 0.0
    if job.rate is not None:  # the load's requests, of which the capacity point's share meet the SLO
        served_rps, good = job.rate, job.rate * attained
    else:  # N users, each at the capacity point's goodput per user (Little's law, the same latency)
        good = (point.goodput_rps or 0.0) / point.level * load
        served_rps = good / attained if attained else 0.0
    mean_out = sum(r.max_tokens for r in sampled[bucket.name]) / len(sampled[bucket.name])
    usd = None if job.price is None else gpus * job.price[0]
    at_users = cap.max_concurrency
    throughput = None if at_users is None else at_users.output_tokens_per_s
    return ConfigResult(
        **base,
        output_tokens_per_s_per_gpu=None if throughput is None else throughput / c.num_gpus,
        output_tokens_per_s_per_user=None if throughput is None or at_users is None else throughput / at_users.level,
        replicas=replicas,
        num_gpus=gpus,
        feasible=True,
        reason="",
        slo_max_request_rate=rate,
        slo_max_concurrency=users,
        step_times=setup.cost_model.step_times,
        usd_per_hour=usd,
        usd_per_m_output_tokens=None if usd is None or not served_rps else usd / (served_rps * mean_out * 3600 / 1e6),
        usd_per_k_good_requests=None if usd is None or not good else usd / (good * 3600 / 1000),
        meets_slo=True,
        ttft_p99_ms=point.ttft_p99_ms,
        tpot_p99_ms=point.tpot_p99_ms,
    )


def rank_key(r: ConfigResult) -> tuple:
    """Meeting the SLO first; then priced by $/hour; then by GPU count (unpriced after priced);
    then the most per-replica capacity (headroom), then the smaller TP."""
    capacity = r.slo_max_request_rate if r.slo_max_request_rate is not None else r.slo_max_concurrency
    return (
        not r.meets_slo,
        r.usd_per_hour is None,
        r.usd_per_hour if r.usd_per_hour is not None else 0.0,
        r.num_gpus if r.num_gpus is not None else math.inf,
        -(capacity or 0.0),
        r.tp,
    )


def progress_line(r: ConfigResult) -> str:
    """One line per finished configuration (the search's progress)."""
    weights = "" if r.weight_dtype == "auto" else f" weights {r.weight_dtype}"
    shape = f" {r.disagg}" if r.disagg else f" x{r.tp}"
    host = f" host {r.host_offload_gib:g} GiB" if r.host_offload_gib else ""
    limits = f"seqs {r.max_num_seqs} tokens {r.max_num_batched_tokens}{host}"
    what = f"{r.gpu}{shape} kv {r.kv_cache_dtype}{weights} {limits}"
    if not r.feasible:
        return f"{what}: infeasible ({r.reason})"
    if not r.meets_slo:
        return f"{what}: misses the SLO ({r.reason})"
    return f"{what}: {r.slo_max_request_rate} req/s per replica, {r.replicas} replica(s)"
