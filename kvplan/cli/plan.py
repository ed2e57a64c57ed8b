"""``kvplan plan``: the cheapest deployment that serves a load of the workload's traffic within its SLO
(kvplan.optimize.plan)."""

from __future__ import annotations

import datetime as dt
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvplan.cli.app import make_console, warn

if TYPE_CHECKING:
    from kvplan.optimize.plan import ConfigResult


def _ints(text: str, field: str) -> list[int]:
    from kvplan.errors import KvplanError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise KvplanError(field, f"must be comma-separated integers (got {text!r})", "e.g. 64,128") from None
    if not values or min(values) < 1:
        raise KvplanError(field, f"must be integers >= 1 (got {text!r})", "e.g. 64,128")
    return list(dict.fromkeys(values))  # a value given twice is judged once


def _dtypes(text: str, field: str) -> list[str]:
    """Comma-separated dtypes, canonical (kvplan.sizing.dtypes), each once.

    Raises:
        KvplanError: naming ``field``: an unknown dtype (with the known ones), or none given.
    """
    from kvplan.errors import KvplanError
    from kvplan.sizing import dtypes

    read = dtypes.canonical_weight if field == "weight_dtype" else dtypes.canonical
    values = [read(d.strip(), field) for d in text.split(",") if d.strip()]
    if not values:
        raise KvplanError(field, f"names no dtype (got {text!r})", "e.g. auto,fp8")
    return list(dict.fromkeys(values))


def plan(
    workload: Annotated[Path, typer.Argument(help="Workload YAML whose traffic and SLO to plan for.")],
    rate: Annotated[float | None, typer.Option(help="The load to serve, requests/s (Poisson arrivals).")] = None,
    users: Annotated[int | None, typer.Option(help="The load to serve, users in flight (closed loop).")] = None,
    model: Annotated[
        str | None, typer.Option(help="The model to serve (default: the workload's first plan: entry's).")
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(help="GPUs to consider, comma-separated (default: H100-SXM,H200,B200,A100-80GB,L40S,L4)."),
    ] = None,
    max_gpus: Annotated[int, typer.Option(help="The most GPUs one replica may use.")] = 8,
    tp: Annotated[str, typer.Option(help="Tensor-parallel sizes to consider, comma-separated.")] = "1,2,4,8",
    kv_cache_dtype: Annotated[
        str, typer.Option(help="KV dtypes to consider, comma-separated: auto, bf16, fp8.")
    ] = "auto",
    weight_dtype: Annotated[str, typer.Option(help="Weight dtypes to consider, comma-separated.")] = "auto",
    max_num_seqs: Annotated[str, typer.Option(help="max_num_seqs values to consider, comma-separated.")] = "256",
    max_num_batched_tokens: Annotated[
        str, typer.Option(help="max_num_batched_tokens values to consider, comma-separated.")
    ] = "8192",
    bucket: Annotated[
        str | None, typer.Option(help="The workload bucket whose traffic it is (default: the first).")
    ] = None,
    prices: Annotated[
        Path | None, typer.Option(help="$/GPU-hour per GPU (YAML or CSV: gpu,usd_per_gpu_hour,source,date).")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(help="Worker processes (default: the machine's cores); with --ray local, its CPUs.")
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Run the configurations as Ray tasks (pip install 'kvplan\\[cluster]'): auto (the running cluster,"
            " or RAY_ADDRESS), local (a private instance for this search), or an address such as ray://head:10001.",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Run folder (default: reports/plan-<name>-<timestamp>/); kvplan report DIR.")
    ] = None,
    attainment: Annotated[
        float, typer.Option(help="SLO attainment target: the fraction of requests that must meet every SLO.")
    ] = 0.95,
    pareto: Annotated[
        Path | None,
        typer.Option(help="Write the Pareto chart here (PNG): output tok/s per GPU against per user, the frontier."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
) -> None:
    # one line: `kvplan --help` shows this paragraph's line breaks as they are written
    """Search GPU kind, TP, dtypes and scheduler limits for the cheapest deployment that serves --rate (or --users) of the workload's traffic within its SLO: per-replica SLO capacity by simulation, replicas, GPUs, cost."""  # noqa: E501
    from kvplan.errors import KvplanError
    from kvplan.optimize import plan as planning
    from kvplan.optimize.plan_pool import search
    from kvplan.optimize.plan_run import PlanRun, write_plan
    from kvplan.results.store import check_out, create_run_dir
    from kvplan.run.sim.facts import model_config
    from kvplan.sizing.gpus.gpus import canonical_gpu
    from kvplan.sizing.gpus.prices import load_prices
    from kvplan.traffic.samples import cached_sample
    from kvplan.traffic.tokenizer import tokenize_function, tokenizer_identity
    from kvplan.workload.file import load_workload

    spec = load_workload(workload)
    warn(spec.warnings, spec.source)
    if spec.variants or any(b.variants for b in spec.buckets):
        warn(
            ["variants: kvplan plan judges the engine section alone; the workload's variants are not used"], spec.source
        )
    if (rate is None) == (users is None):
        raise KvplanError("rate", "give the load as --rate or as --users, one of them", "e.g. --rate 20")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise KvplanError("rate", f"must be a finite number > 0 requests/s (got {rate:g})")
    if users is not None and users < 1:
        raise KvplanError("users", f"must be >= 1 (got {users})")
    if not 0 < attainment <= 1:
        raise KvplanError("attainment", f"must be in (0, 1] (got {attainment:g})", "e.g. --attainment 0.95")
    if max_gpus < 1:
        raise KvplanError("max_gpus", f"must be >= 1 (got {max_gpus})")
    if jobs is not None and jobs < 1:
        raise KvplanError("jobs", f"must be >= 1 (got {jobs})", "or leave it out: the machine's cores")
    if not any(v is not None for v in (spec.slo.ttft_ms, spec.slo.tpot_ms, spec.slo.e2e_ms)):
        raise KvplanError("slo", "the workload sets no SLO, so every deployment meets it", "add slo: {ttft_ms: 2000}")
    if spec.dataset.sessions is not None:
        raise KvplanError(
            "dataset.sessions",
            "kvplan plan sizes independent requests; a session's turns depend on each other",
            "plan on the same buckets without sessions",
        )
    if model is None:
        if not spec.plan:
            raise KvplanError("model", "no --model and the workload has no plan: entry", "give --model llama-3.1-8b")
        model = spec.resolve_model(spec.plan[0].model)
    names = [b.name for b in spec.buckets]
    if bucket is not None and bucket not in names:
        raise KvplanError("bucket", f"unknown bucket {bucket!r}", f"give one of {', '.join(names)}")
    index = names.index(bucket) if bucket is not None else 0
    chosen = []
    for name in [g.strip() for g in (gpus.split(",") if gpus else planning.DEFAULT_GPUS) if g.strip()]:
        try:
            chosen.append(canonical_gpu(name))
        except KvplanError as err:
            closest = (err.fix or "").split("; or give")[0] or "give GPU names as kvplan estimate knows them"
            raise KvplanError("gpus", err.problem, closest) from None
    if not chosen:
        raise KvplanError("gpus", f"names no GPU (got {gpus!r})", "e.g. --gpus H100-SXM,A100-80GB")
    chosen = list(dict.fromkeys(chosen))
    priced = load_prices(prices)
    configs = planning.grid(
        chosen,
        _ints(tp, "tp"),
        _dtypes(kv_cache_dtype, "kv_cache_dtype"),
        _dtypes(weight_dtype, "weight_dtype"),
        _ints(max_num_seqs, "max_num_seqs"),
        _ints(max_num_batched_tokens, "max_num_batched_tokens"),
        max_gpus,
    )
    if not configs:
        raise KvplanError("tp", f"no --tp value is within --max-gpus {max_gpus}", "give a smaller --tp")
    engine_model = spec.engine.model
    sampled = cached_sample(
        spec,
        lambda: tokenize_function(engine_model),
        model_config(engine_model).get("vocab_size") or 1,
        tokenizer_identity(engine_model),
    ).requests
    price_of = {g: (p.usd_per_gpu_hour, p.source) for g, p in priced.items()}
    work = [planning.Job(spec, model, index, c, sampled, rate, users, attainment, price_of.get(c.gpu)) for c in configs]
    check_out(out)
    if pareto is not None and not pareto.parent.is_dir():
        raise KvplanError("pareto", f"{pareto.parent} is not a folder", "give a PNG path in an existing folder")
    run_dir = create_run_dir(f"plan-{spec.name}", out)  # before the search: a place for what it finds
    console = make_console()
    with _progress(console, len(work), quiet=json_output) as say:
        results, interrupted = search(work, jobs or os.cpu_count() or 1, say, ray)
    load = {"rate": rate} if rate is not None else {"users": users}
    best = results[0] if results and results[0].meets_slo else None
    run = PlanRun(
        load=load,
        slo=spec.slo.model_dump(),
        configs=results,
        best=best,
        model=model,
        workload=str(workload),
        bucket=names[index],
        attainment=attainment,
        num_configs=len(work),
        interrupted=interrupted,
        created=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )
    write_plan(run_dir, run)
    if pareto is not None:
        from kvplan.optimize.plan_view import plot_pareto

        plot_pareto(results, spec.slo.tpot_ms, pareto)
    if interrupted:
        print(f"interrupted: {len(results)} of {len(work)} configurations finished, kept in {run_dir}", file=sys.stderr)
    elif not any(r.feasible for r in results):
        from kvplan.sizing.gpus.gpus import lookup_gpu

        largest = max(results, key=lambda r: r.tp * lookup_gpu(r.gpu)[1])
        raise KvplanError(
            "model",
            f"no configuration fits {model}; the largest candidate, {largest.gpu} x{largest.tp}: {largest.reason}",
            "allow more GPUs (--max-gpus, --tp), fp8 weights or KV, or a larger GPU",
        )
    if json_output:
        print(run.model_dump_json(indent=2))
    else:
        from kvplan.optimize.plan_view import print_plan

        print_plan(results, model, load, console, interrupted=(len(results), len(work)) if interrupted else None)
        console.print(f"report: {run_dir}", markup=False, highlight=False)
    if interrupted:
        raise typer.Exit(130)


@contextmanager
def _progress(console, total: int, quiet: bool) -> Iterator[Callable[[ConfigResult], None]]:
    """A callback printing one line per finished configuration, under a rich bar on a terminal."""
    from kvplan.optimize.plan import progress_line

    if quiet:
        yield lambda r: None
        return
    if not console.is_terminal:
        yield lambda r: console.print(progress_line(r), markup=False, highlight=False)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("configurations"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        task = bar.add_task("plan", total=total)

        def say(r: ConfigResult) -> None:
            bar.console.print(progress_line(r), markup=False, highlight=False)
            bar.advance(task)

        yield say
