"""``kvplan advise``: which KV optimisation pays for this traffic, simulated instead of guessed.

The same sampled requests run on the workload's engine (or ``--model`` on ``--gpu``) as it is and
under each alternative the serving guides weigh, one setting changed at a time::

    prefix caching        on <-> off             (pays only where prompts share full blocks)
    KV cache dtype        fp8 against bf16       (twice the tokens per byte; its quality check is the condition)
    chunked prefill       max_num_batched_tokens / 2 and x 2
    max_num_seqs          / 2 and x 2
    block size            16 <-> 32
    host / disk offload   a KV tier of 4 / 16 x the pool's bytes below it (prefix caching on;
                          kvplan.optimize.advise_offload)
    disaggregation        1 prefill + 1 decode worker <-> one engine (the workload's own engine only)

For each: the KV pool in tokens, and per bucket the SLO capacity (the highest concurrency and
request rate at which the attainment target of requests meet every SLO: kvplan.run.sim.search),
the goodput there, and at the bucket's own top load level (a trace bucket: the trace at its own
timing) the goodput, the request throughput, the median TTFT and the prefix hit rate. The verdict
compares each alternative with the workload as it is, over every bucket's answers: both capacity
answers where the search gave them (max users only where it found an edge, not where it stopped
at its ceiling of users; a difference of one user, its resolution, counts as none), else goodput
at the top level, else request throughput there. The mean relative gain decides: ``worth it``
above ``NOISE`` (5 %), ``not worth it`` below -5 %, ``within noise`` between (a rate search
resolves 2 %). Prefix caching with under 1 % of prompt tokens hit is ``not worth it`` whatever else
moved: there is nothing to reuse (the guides' rule of thumb puts the break-even near 30 % reuse,
since hashing and eviction cost what the simulation does not charge).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from kvplan.errors import KvplanError
from kvplan.optimize.advise_offload import NO_RETURN, offload_changes, tier_figures
from kvplan.results.stats.offload import OffloadSummary
from kvplan.run.checks import check_requests_fit
from kvplan.run.sim.run import sample
from kvplan.run.sim.search import Prober, resolve_auto, search_capacity, simulated_knees
from kvplan.run.sim.setups import SimSetup
from kvplan.workload.admission import EngineDisagg
from kvplan.workload.schema import Workload
from kvplan.workload.trace import read_trace

NOISE = 0.05  # relative change below which two answers are the same (the searches' resolution and more)
NO_REUSE = 0.01  # a prefix hit rate below this: nothing to reuse


@dataclass(frozen=True)
class Alternative:
    """One setting changed: ``engine`` (workload engine keys) and, for a GPU target, the KV dtype
    option; ``condition``: what must hold besides the numbers."""

    name: str
    change: str
    engine: dict
    kv_cache_dtype: str | None = None
    condition: str = ""
    removes: bool = False  # the workload has the optimisation: the change simulates it taken away
    tier: str | None = None  # an offload alternative's tier (host, disk; kvplan.optimize.advise_offload)


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True)


class BucketAdvice(_Part):
    """One bucket under one alternative (latencies ms, rates per second; None: not reached)."""

    name: str
    max_users: int | None
    max_users_bound: bool = False  # the search stopped at its ceiling of users: max_users is a floor
    max_request_rate: float | None
    goodput_at_max: float | None
    level: str | None  # the bucket's top load level, where the next four were measured
    goodput: float | None
    requests_per_s: float | None
    ttft_p50_ms: float | None
    prefix_hit_rate: float | None
    offload: OffloadSummary | None = None  # the top level's offload tiers; None without any


class AlternativeAdvice(_Part):
    """One alternative's outcome and its verdict against the workload as it is."""

    name: str
    change: str
    condition: str
    pool_tokens: int | None
    buckets: list[BucketAdvice]
    verdict: str  # baseline | worth it | not worth it | within noise | cannot run
    reason: str


class Advice(_Part):
    """What ``kvplan advise`` prints (``--json``: this object)."""

    workload: str
    target: str
    step_times: str
    attainment_target: float
    alternatives: list[AlternativeAdvice]


def alternatives(
    workload: Workload, on_gpu: bool, kv_cache_dtype: str, pool_bytes: int | None = None
) -> list[Alternative]:
    """The alternatives to the workload's engine (see the module docstring), each one change; with
    ``pool_bytes`` (the device pool's bytes per engine instance) also the offload tiers
    (kvplan.optimize.advise_offload)."""
    engine = workload.engine
    caching = engine.enable_prefix_caching
    out = [
        Alternative(
            "prefix caching",
            f"enable_prefix_caching: {str(not caching).lower()}" + (" (it is on: simulated off)" if caching else ""),
            {"enable_prefix_caching": not caching},
            removes=caching,
        )
    ]
    fp8 = (kv_cache_dtype if on_gpu else engine.kv_cache_dtype) == "fp8"
    other = "bf16" if fp8 else "fp8"
    out.append(
        Alternative(
            "fp8 KV cache",
            f"kv_cache_dtype: {other}" + (" (it is fp8: simulated bf16)" if fp8 else ""),
            {} if on_gpu else {"kv_cache_dtype": other},
            kv_cache_dtype=other if on_gpu else None,
            condition="fp8 KV holds only if its quality check passes (kvplan loadtest with"
            " engine.kv_cache_dtype: fp8 measures greedy agreement and KL against bf16 KV)",
            removes=fp8,
        )
    )
    budget = engine.max_num_batched_tokens
    for value in sorted({max(1, budget // 2), budget * 2} - {budget}):
        out.append(
            Alternative(f"step budget {value}", f"max_num_batched_tokens: {value}", {"max_num_batched_tokens": value})
        )
    seqs = engine.max_num_seqs
    for value in sorted({max(1, seqs // 2), seqs * 2} - {seqs}):
        out.append(Alternative(f"max_num_seqs {value}", f"max_num_seqs: {value}", {"max_num_seqs": value}))
    block = 32 if engine.block_size != 32 else 16
    change: dict = {"block_size": block}
    if engine.num_blocks is not None and not on_gpu:  # the same pool in bytes: fewer, larger blocks
        change["num_blocks"] = max(1, engine.num_blocks * engine.block_size // block)
    out.append(Alternative(f"block size {block}", ", ".join(f"{k}: {v}" for k, v in change.items()), change))
    if pool_bytes is not None and engine.disagg is None:  # no offload tiers with engine.disagg
        for name, said, update, removes in offload_changes(workload, pool_bytes):
            out.append(Alternative(name, said, update, removes=removes, tier=name.split()[0]))
    if not on_gpu:  # a GPU's disaggregation is a deployment's question: kvplan plan --disagg
        split = engine.disagg is not None
        pools = {"prefill": {"workers": 1}, "decode": {"workers": 1}}
        out.append(
            Alternative(
                "disaggregation",
                "disagg: null (it is disaggregated: simulated as one engine)" if split else f"disagg: {pools}",
                {"disagg": None if split else pools},
                condition="two engines instead of one, each on its own machine in the simulation (the"
                " prefill and decode pools, engine.disagg), the KV moved over engine.disagg.link",
                removes=split,
            )
        )
    return out


def _changed(workload: Workload, engine: dict) -> Workload:
    if not engine:
        return workload
    if engine.get("disagg") is not None:  # a section: validated as the YAML's would be
        engine = {**engine, "disagg": EngineDisagg.model_validate(engine["disagg"])}
    changed = workload.model_copy(update={"engine": workload.engine.model_copy(update=engine)})
    changed._source, changed._sha256 = workload.source, workload.sha256
    return changed


def _outcome(workload: Workload, setup: SimSetup, sampled: dict, attainment: float) -> list[BucketAdvice]:
    """Per bucket: the SLO search's answers and the bucket's top level, simulated on ``setup``."""
    facts, pools = setup.facts, setup.make_backend  # pools: a disaggregated engine's (no knee: no one pool)
    knees = {} if pools else simulated_knees(workload, facts, sampled)
    found = search_capacity(workload, facts, sampled, setup.clock, attainment, knees, make_backend=pools)
    caps = {c.name: c for c in found}
    prober = Prober(workload, facts, setup.clock, sampled, pools)
    out = []
    trace = read_trace(workload)
    for i, bucket in enumerate(workload.buckets):
        cap = caps[bucket.name]
        top = None
        if trace is not None:  # a trace bucket's one level: the trace at its own timing
            top = prober.level(i, "open", trace.mean_rate, variant=prober.slo_variant, offsets=trace.offsets)
            label = f"{trace.mean_rate:.3g} req/s (trace)"
        elif bucket.concurrency and bucket.concurrency != "auto":
            top = prober.level(i, "closed", max(bucket.concurrency), variant=prober.slo_variant)
            label = f"c={max(bucket.concurrency)}"
        elif bucket.request_rates:
            top = prober.level(i, "open", max(bucket.request_rates), variant=prober.slo_variant)
            label = f"{max(bucket.request_rates):g} req/s"
        best = cap.max_concurrency or cap.max_request_rate
        out.append(
            BucketAdvice(
                name=bucket.name,
                max_users=None if cap.max_concurrency is None else int(cap.max_concurrency.level),
                max_users_bound=cap.concurrency_bound == "max_users",
                max_request_rate=None if cap.max_request_rate is None else float(cap.max_request_rate.level),
                goodput_at_max=None if best is None else best.goodput_rps,
                level=label if top is not None else None,
                goodput=None if top is None else top.goodput_rps,
                requests_per_s=None if top is None else top.requests_per_s,
                ttft_p50_ms=None if top is None or top.ttft_ms is None else top.ttft_ms.p50,
                prefix_hit_rate=None if top is None else top.prefix_hit_rate,
                offload=None if top is None else top.offload,
            )
        )
    return out


def _gain(base: float | None, other: float | None) -> float | None:
    if base is None and other is None:
        return None
    if not base:
        return 1.0 if other else 0.0  # from nothing to something: a gain; 0 -> 0: none
    return (other or 0.0) / base - 1


def _compared(b: BucketAdvice, m: BucketAdvice) -> list[tuple[str, float | None, float | None]]:
    """What the two outcomes of one bucket are judged by (see the module docstring): both SLO
    capacity answers where the search gave them (max users only where it found an edge, not its
    ceiling), else goodput at the top level where either has some, else request throughput there;
    each as (what, base value, alternative value)."""
    out: list[tuple[str, float | None, float | None]] = []
    if (b.max_users is not None or m.max_users is not None) and not (b.max_users_bound or m.max_users_bound):
        out.append(("max users", b.max_users, m.max_users))
    if b.max_request_rate is not None or m.max_request_rate is not None:
        out.append(("max req/s", b.max_request_rate, m.max_request_rate))
    if out:
        return out
    if b.goodput or m.goodput:
        return [(f"goodput at {b.level}", b.goodput, m.goodput)]
    if b.requests_per_s is not None or m.requests_per_s is not None:
        return [(f"req/s at {b.level}", b.requests_per_s, m.requests_per_s)]
    return []


def verdict(alt: Alternative, base: list[BucketAdvice], mine: list[BucketAdvice]) -> tuple[str, str]:
    """(verdict, the numbers behind it) of ``mine`` against ``base``: the mean relative gain over
    every bucket's answers from ``_compared`` (a difference of one user, the search's resolution,
    counts as none), against ``NOISE`` (see the module docstring)."""
    gains, said = [], []
    for b, m in zip(base, mine):
        for label, before, after in _compared(b, m):
            gain = _gain(before, after)
            assert gain is not None  # _compared gives a pair with a value
            if label == "max users" and before is not None and after is not None and abs(after - before) <= 1:
                gain = 0.0
            gains.append(gain)
            said.append(f"{b.name} {label} {_fmt(before)} -> {_fmt(after)} ({gain:+.0%})")
    if alt.removes:  # the change takes the optimisation away: it pays where taking it away loses
        gains = [-g for g in gains]
        said = [f"without it: {s}" for s in said]
    if "enable_prefix_caching" in alt.engine:
        with_caching = base if alt.removes else mine
        rates = [m.prefix_hit_rate for m in with_caching if m.prefix_hit_rate is not None]
        if rates and max(rates) < NO_REUSE:
            return "not worth it", "; ".join(
                [f"no prefix reuse: {max(rates):.1%} of prompt tokens hit the cache", *said]
            )
        if rates:
            said.append(f"prefix hit rate {max(rates):.1%} with it")
    if alt.tier is not None:
        with_tier = base if alt.removes else mine
        words, back = tier_figures(alt.tier, [(m.name, m.offload) for m in with_tier])
        if back is None or back < NO_RETURN:
            why = (
                "no block was evicted into it"
                if back is None
                else f"only {back:.1%} of the blocks evicted into it came back"
            )
            return "not worth it", "; ".join([why, words, *said])
        said.append(words)
    if not gains:
        return "within noise", "no capacity answer, goodput or throughput to compare"
    mean = sum(gains) / len(gains)
    text = "; ".join(said)
    if mean > NOISE:
        return "worth it", text
    if mean < -NOISE:
        return "not worth it", text
    return "within noise", text


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def advise(
    workload: Workload,
    setup_for: Callable[[Workload, str | None], SimSetup],
    *,
    on_gpu: bool,
    kv_cache_dtype: str,
    attainment: float,
) -> Advice:
    """The workload as it is, then each alternative, on the same sampled requests.

    setup_for(workload, kv_cache_dtype): the SimSetup to simulate ``workload`` on (kv_cache_dtype:
        the GPU KV dtype option of an alternative, None: the one given).

    Raises:
        KvplanError: what sampling the workload, or building its own setup, raises (an alternative
            that cannot run is reported as ``cannot run`` with its reason instead).
    """
    setup = setup_for(workload, None)
    sampled = sample(workload, setup.facts).requests
    workload = resolve_auto(workload, setup.facts, sampled)
    base = _outcome(workload, setup, sampled, attainment)
    rows = [
        AlternativeAdvice(
            name="as it is",
            change="the workload's engine",
            condition="",
            pool_tokens=setup.facts.num_blocks * setup.facts.block_size,
            buckets=base,
            verdict="baseline",
            reason="",
        )
    ]
    pool_bytes = setup.facts.num_blocks * setup.facts.bytes_per_block
    for alt in alternatives(workload, on_gpu, kv_cache_dtype, pool_bytes):
        changed = _changed(workload, alt.engine)
        try:
            own = setup_for(changed, alt.kv_cache_dtype)
            check_requests_fit(changed, own.facts, sampled)
        except KvplanError as err:
            rows.append(
                AlternativeAdvice(
                    name=alt.name,
                    change=alt.change,
                    condition=alt.condition,
                    pool_tokens=None,
                    buckets=[],
                    verdict="cannot run",
                    reason=f"{err.field}: {err.problem}",
                )
            )
            continue
        mine = _outcome(changed, own, sampled, attainment)
        said, why = verdict(alt, base, mine)
        rows.append(
            AlternativeAdvice(
                name=alt.name,
                change=alt.change,
                condition=alt.condition,
                pool_tokens=own.facts.num_blocks * own.facts.block_size,
                buckets=mine,
                verdict=said,
                reason=why,
            )
        )
    return Advice(
        workload=workload.name,
        target=setup.target if setup.gpu is None else f"{setup.facts.model} on {setup.gpu} x{setup.tp}",
        step_times=setup.cost_model.step_times,
        attainment_target=attainment,
        alternatives=rows,
    )
