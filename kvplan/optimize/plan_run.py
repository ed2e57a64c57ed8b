"""``kvplan plan`` as one library call: what was asked (PlanRequest) -> the search -> its run folder.

``plan_deployments`` checks the request against the workload (each problem one KvplanError naming
the option), builds the grid (kvplan.optimize.plan.grid), samples the bucket's requests once,
judges every configuration (kvplan.optimize.plan_pool.search: here, on a process pool or on Ray),
and writes plan.json and its views (kvplan.results.report.plan) into the run folder, which exists
before the search starts, so an interrupted search keeps what it found.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.optimize import plan as planning
from kvplan.optimize import plan_windows
from kvplan.results.plan_result import ConfigResult, PlanRun
from kvplan.traffic.requests import SampledRequest

Progress = Callable[[int], AbstractContextManager[Callable[[ConfigResult], None]]]
Warn = Callable[[list[str], str], None]


@dataclass(frozen=True)
class PlanRequest:
    """What ``kvplan plan`` is asked, one field per option (the CLI's names, lists already split).

    ``rate`` (requests/s, Poisson arrivals) or ``users`` (closed loop) is the load, exactly one;
    ``gpus`` as kvplan estimate names them; dtypes as kvplan.sizing.dtypes names them (aliases
    accepted); ``out`` the run folder (None: reports/plan-<name>-<timestamp>/).
    """

    workload: Path
    rate: float | None = None
    users: int | None = None
    model: str | None = None
    gpus: tuple[str, ...] = planning.DEFAULT_GPUS
    max_gpus: int = 8
    tp: tuple[int, ...] = planning.DEFAULT_TP
    kv_cache_dtypes: tuple[str, ...] = ("auto",)
    weight_dtypes: tuple[str, ...] = ("auto",)
    max_num_seqs: tuple[int, ...] = (256,)
    max_num_batched_tokens: tuple[int, ...] = (8192,)
    bucket: str | None = None
    prices: Path | None = None
    jobs: int = 1
    ray: str | None = None
    out: Path | None = None
    attainment: float = 0.95
    pareto: Path | None = None
    window_s: float | None = None  # size a trace window by window (kvplan.optimize.plan_windows)
    scale_up_s: float = plan_windows.DEFAULT_SCALE_UP_S
    window_requests: int = plan_windows.DEFAULT_WINDOW_REQUESTS
    disagg: bool = False  # also search disaggregated units (kvplan.optimize.plan_disagg)
    prefill_workers: tuple[int, ...] = (1, 2)
    decode_workers: tuple[int, ...] = (1, 2, 4)
    links: tuple[str, ...] = ("rdma-400g",)
    prefill_tp: tuple[int, ...] | None = None  # None: tp's values (so for the rest)
    decode_tp: tuple[int, ...] | None = None
    prefill_max_num_seqs: tuple[int, ...] | None = None
    prefill_max_num_batched_tokens: tuple[int, ...] | None = None
    host_offload_gib: tuple[float, ...] = (0.0,)  # host KV tier sizes per replica (kvplan.optimize.plan_offload)


@dataclass(frozen=True)
class PlanOutcome:
    """A finished (or interrupted) search: the saved PlanRun and its run folder."""

    run: PlanRun
    run_dir: Path


@contextmanager
def _silent(total: int) -> Iterator[Callable[[ConfigResult], None]]:
    yield lambda r: None


def _check(request: PlanRequest) -> None:
    """The request's own values (before the workload is read)."""
    rate, users = request.rate, request.users
    if request.window_s is not None:
        if rate is not None or users is not None:
            raise KvplanError("window", "takes the load from the trace's own arrivals", "leave out --rate and --users")
        if not (request.scale_up_s >= 0 and math.isfinite(request.scale_up_s)):
            raise KvplanError("scale_up_s", f"must be a finite number of seconds >= 0 (got {request.scale_up_s:g})")
        if request.window_requests < 1:
            raise KvplanError("window_requests", f"must be >= 1 (got {request.window_requests})", "e.g. 1000")
    elif (rate is None) == (users is None):
        raise KvplanError("rate", "give the load as --rate or as --users, one of them", "e.g. --rate 20")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise KvplanError("rate", f"must be a finite number > 0 requests/s (got {rate:g})")
    if users is not None and users < 1:
        raise KvplanError("users", f"must be >= 1 (got {users})")
    if not 0 < request.attainment <= 1:
        raise KvplanError("attainment", f"must be in (0, 1] (got {request.attainment:g})", "e.g. --attainment 0.95")
    if request.max_gpus < 1:
        raise KvplanError("max_gpus", f"must be >= 1 (got {request.max_gpus})")
    if request.jobs < 1:
        raise KvplanError("jobs", f"must be >= 1 (got {request.jobs})", "or leave it out: the machine's cores")
    if request.disagg and request.window_s is not None:
        raise KvplanError("disagg", "is not judged window by window yet", "leave out --window or --disagg")
    for field in (
        "tp",
        "max_num_seqs",
        "max_num_batched_tokens",
        "prefill_workers",
        "decode_workers",
        "prefill_tp",
        "decode_tp",
        "prefill_max_num_seqs",
        "prefill_max_num_batched_tokens",
    ):
        values = getattr(request, field)
        if values is not None and (not values or min(values) < 1):
            raise KvplanError(
                field, f"must be integers >= 1 (got {','.join(map(str, values)) or 'none'})", "e.g. 64,128"
            )


def _dtypes(values: tuple[str, ...], field: str) -> list[str]:
    """``values`` canonical (kvplan.sizing.dtypes), each once.

    Raises:
        KvplanError: naming ``field``: an unknown dtype (with the known ones), or none given.
    """
    from kvplan.sizing import dtypes

    read = dtypes.canonical_weight if field == "weight_dtype" else dtypes.canonical
    out = [read(d, field) for d in values if d]
    if not out:
        raise KvplanError(field, "names no dtype", "e.g. auto,fp8")
    return list(dict.fromkeys(out))


def _disagg_configs(request: PlanRequest, base: list[planning.Config], model_dir: str) -> list[planning.Config]:
    """--disagg's units over ``base``'s GPUs, dtypes and limits (kvplan.optimize.plan_disagg).

    Raises:
        KvplanError: ``links``: an unknown link (with the closest) or none; ``prefill_tp`` /
            ``decode_tp``: a tp that does not divide the model's attention heads;
            ``prefill_workers`` / ``decode_workers``: over MAX_POOL_WORKERS (kvplan.workload.lengths).
    """
    from kvplan.optimize.plan_disagg import check_pool_tps, disagg_grid
    from kvplan.sizing.gpus.links import lookup_link
    from kvplan.workload.lengths import check_pool_workers

    for field in ("prefill_workers", "decode_workers"):  # each unit a DisaggPool: its bound, named as the option
        for value in getattr(request, field):
            try:
                check_pool_workers(value)
            except ValueError as err:
                raise KvplanError(field, *str(err).split("; ", 1)) from None
    links = list(dict.fromkeys(lookup_link(name, "links").name for name in request.links))
    if not links:
        raise KvplanError("links", "names no link", "e.g. --links nvlink,rdma-400g")
    pools: dict[str, Sequence[int]] = {
        "prefill_tp": request.prefill_tp or request.tp,
        "tp": request.decode_tp or request.tp,
        "prefill_workers": request.prefill_workers,
        "decode_workers": request.decode_workers,
        "prefill_max_num_seqs": request.prefill_max_num_seqs or request.max_num_seqs,
        "prefill_max_num_batched_tokens": request.prefill_max_num_batched_tokens or request.max_num_batched_tokens,
    }
    for key, field in (("prefill_tp", "prefill_tp"), ("tp", "decode_tp")):
        # given: each must divide the heads; taken from --tp: the ones that do (as aggregated, the
        # rest would only come back infeasible)
        pools[key] = check_pool_tps(model_dir, pools[key], field, strict=getattr(request, field) is not None)
    return disagg_grid(base, {k: list(dict.fromkeys(v)) for k, v in pools.items()}, links, request.max_gpus)


def _gpus(names: tuple[str, ...]) -> list[str]:
    from kvplan.sizing.gpus.gpus import canonical_gpu

    chosen = []
    for name in names:
        try:
            chosen.append(canonical_gpu(name))
        except KvplanError as err:
            closest = (err.fix or "").split("; or give")[0] or "give GPU names as kvplan estimate knows them"
            raise KvplanError("gpus", err.problem, closest) from None
    if not chosen:
        raise KvplanError("gpus", "names no GPU", "e.g. --gpus H100-SXM,A100-80GB")
    return list(dict.fromkeys(chosen))


def plan_deployments(request: PlanRequest, progress: Progress = _silent, warn: Warn | None = None) -> PlanOutcome:
    """Search ``request``'s grid for the cheapest deployment that serves its load within the
    workload's SLO (kvplan.optimize.plan's module docstring has the rules), and save it.

    ``progress(total)`` is entered around the search and its callback called with each
    configuration as it finishes; ``warn(lines, source)`` gets the workload's warnings.

    Raises:
        KvplanError: bad input, naming the option or the workload field (nothing is written); or,
            after plan.json is written, no configuration fits the model at all (field ``model``).
    """
    from kvplan.optimize.plan_disagg import disagg_verdict
    from kvplan.optimize.plan_offload import check_sizes, offload_verdict, with_host_tiers
    from kvplan.optimize.plan_pool import search
    from kvplan.results.report.plan import write_plan
    from kvplan.results.store import check_out, create_run_dir
    from kvplan.run.sim.facts import model_config
    from kvplan.sizing.gpus.gpus import lookup_gpu
    from kvplan.sizing.gpus.prices import load_prices
    from kvplan.traffic.samples import cached_sample
    from kvplan.traffic.tokenizer import tokenize_function, tokenizer_identity
    from kvplan.workload.file import load_workload

    spec = load_workload(request.workload)
    warnings = list(spec.warnings)
    if spec.variants or any(b.variants for b in spec.buckets):
        warnings.append("variants: kvplan plan judges the engine section alone; the workload's variants are not used")
    if warn is not None and warnings:
        warn(warnings, spec.source)
    _check(request)
    if not any(v is not None for v in (spec.slo.ttft_ms, spec.slo.tpot_ms, spec.slo.e2e_ms)):
        raise KvplanError("slo", "the workload sets no SLO, so every deployment meets it", "add slo: {ttft_ms: 2000}")
    if spec.dataset.sessions is not None:
        raise KvplanError(
            "dataset.sessions",
            "kvplan plan sizes independent requests; a session's turns depend on each other",
            "plan on the same buckets without sessions",
        )
    model = request.model
    if model is None:
        if not spec.plan:
            raise KvplanError("model", "no --model and the workload has no plan: entry", "give --model llama-3.1-8b")
        model = spec.resolve_model(spec.plan[0].model)
    names = [b.name for b in spec.buckets]
    if request.bucket is not None and request.bucket not in names:
        raise KvplanError("bucket", f"unknown bucket {request.bucket!r}", f"give one of {', '.join(names)}")
    index = names.index(request.bucket) if request.bucket is not None else 0
    chosen = _gpus(request.gpus)
    priced = load_prices(request.prices)
    configs = planning.grid(
        chosen,
        list(dict.fromkeys(request.tp)),
        _dtypes(request.kv_cache_dtypes, "kv_cache_dtype"),
        _dtypes(request.weight_dtypes, "weight_dtype"),
        list(dict.fromkeys(request.max_num_seqs)),
        list(dict.fromkeys(request.max_num_batched_tokens)),
        request.max_gpus,
    )
    if request.disagg:
        configs += _disagg_configs(request, configs, spec.resolve_model(model))
    sizes = check_sizes(request.host_offload_gib)
    if any(sizes):
        if not spec.engine.enable_prefix_caching:
            problem = "a host KV tier keeps prefix-cache blocks, and the engine section turns prefix caching off"
            raise KvplanError("host_offload_gib", problem, "set engine.enable_prefix_caching: true, or give 0")
        configs = with_host_tiers(configs, sizes)
    if not configs:
        raise KvplanError("tp", f"no --tp value is within --max-gpus {request.max_gpus}", "give a smaller --tp")
    engine_model = spec.engine.model
    vocab = model_config(engine_model).get("vocab_size") or 1
    rate, users = request.rate, request.users
    sampled_requests: Mapping[str, list[SampledRequest]]
    if request.window_s is None:
        sampled = cached_sample(spec, lambda: tokenize_function(engine_model), vocab, tokenizer_identity(engine_model))
        sampled_requests = sampled.requests
    else:
        windowed = plan_windows.TraceWindows(spec, index, vocab, request.window_s, request.window_requests, model)
        spec, sampled_requests, rate = windowed.busiest_spec, windowed.busiest, windowed.busiest_rate
    price_of = {g: (p.usd_per_gpu_hour, p.source) for g, p in priced.items()}
    work = [
        planning.Job(spec, model, index, c, sampled_requests, rate, users, request.attainment, price_of.get(c.gpu))
        for c in configs
    ]
    check_out(request.out)
    pareto = request.pareto
    if pareto is not None and not pareto.parent.is_dir():
        raise KvplanError("pareto", f"{pareto.parent} is not a folder", "give a PNG path in an existing folder")
    run_dir = create_run_dir(f"plan-{spec.name}", request.out)  # before the search: a place for what it finds
    with progress(len(work)) as say:
        results, interrupted = search(work, request.jobs, say, request.ray)
    load: dict[str, float | int] = {"rate": rate} if rate is not None else {"users": users or 0}
    windows = None
    best = results[0] if results and results[0].meets_slo else None
    if request.window_s is not None and best is not None and not interrupted:
        with progress(len(windowed.jobs)) as say:
            price = price_of.get(best.gpu)
            found = windowed.judge(best, request.attainment, request.scale_up_s, price, request.jobs, request.ray, say)
            windows, interrupted = found
    run = PlanRun(
        load=load,
        slo=spec.slo.model_dump(),
        configs=results,
        best=best,
        model=model,
        workload=str(request.workload),
        bucket=names[index],
        attainment=request.attainment,
        num_configs=len(work),
        interrupted=interrupted,
        created=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        windows=windows,
        disagg_verdict=disagg_verdict(results) if request.disagg else None,
        offload_verdict=offload_verdict(results),
    )
    write_plan(run_dir, run)
    if pareto is not None:
        from kvplan.results.report.plan_view import plot_pareto

        plot_pareto(results, spec.slo.tpot_ms, pareto)
    if not interrupted and not any(r.feasible for r in results):
        largest = max(results, key=lambda r: r.tp * lookup_gpu(r.gpu)[1])
        raise KvplanError(
            "model",
            f"no configuration fits {model}; the largest candidate, {largest.gpu} x{largest.tp}: {largest.reason}",
            "allow more GPUs (--max-gpus, --tp), fp8 weights or KV, or a larger GPU",
        )
    return PlanOutcome(run, run_dir)
