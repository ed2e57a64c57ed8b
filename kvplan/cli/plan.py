"""``kvplan plan``: the cheapest deployment that serves a load of the workload's traffic within its SLO
(kvplan.optimize.plan)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvplan.cli.app import given_only_with, make_console, simulation_gc, warn

if TYPE_CHECKING:
    from kvplan.results.plan_result import ConfigResult


def _ints(text: str, field: str) -> list[int]:
    from kvplan.errors import KvplanError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise KvplanError(field, f"must be comma-separated integers (got {text!r})", "e.g. 64,128") from None
    if not values or min(values) < 1:
        raise KvplanError(field, f"must be integers >= 1 (got {text!r})", "e.g. 64,128")
    return list(dict.fromkeys(values))  # a value given twice is judged once


def _floats(text: str, field: str) -> tuple[float, ...]:
    from kvplan.errors import KvplanError

    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise KvplanError(field, f"must be comma-separated numbers (got {text!r})", "e.g. 0,64,256") from None


def _maybe_ints(text: str | None, field: str) -> tuple[int, ...] | None:
    return None if text is None else tuple(_ints(text, field))


def _split(text: str) -> tuple[str, ...]:
    """Comma-separated names, stripped, the empty ones left out."""
    return tuple(v.strip() for v in text.split(",") if v.strip())


# options read only with --disagg (or --window): typed without it, they are refused, not ignored
_DISAGG_OPTIONS: tuple[str, ...] = ("prefill_workers", "decode_workers", "links", "prefill_tp", "decode_tp")
_DISAGG_OPTIONS += ("prefill_max_num_seqs", "prefill_max_num_batched_tokens")


def plan(
    ctx: typer.Context,
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
    window: Annotated[
        float | None,
        typer.Option(
            help="Size a trace workload window by window, this many seconds each (3600: per hour): replicas per"
            " window, a static deployment sized for the busiest against one that follows; the load is the trace's.",
        ),
    ] = None,
    scale_up_s: Annotated[
        float, typer.Option(help="With --window: seconds a new replica takes to serve; a scale-up is paid this early.")
    ] = 300.0,
    window_requests: Annotated[
        int, typer.Option(help="With --window: requests per window the capacity search uses at most (evenly spaced).")
    ] = 300,
    host_offload_gib: Annotated[
        str,
        typer.Option(
            help="GiB of host memory per replica to keep as a KV offload tier, comma-separated sizes to consider"
            " (0: none); each replica configuration is judged with each (engine.offload.host_gib)."
        ),
    ] = "0",
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    disagg: Annotated[
        bool,
        typer.Option(
            "--disagg",
            help="Also search prefill/decode disaggregated units (the worker counts, pool tps, prefill limits and"
            " links below; the decode pool's limits the grid's) beside the aggregated replicas, and say whether"
            " disaggregation pays.",
        ),
    ] = False,
    prefill_workers: Annotated[
        str, typer.Option(help="With --disagg: prefill workers per unit to consider, comma-separated.")
    ] = "1,2",
    decode_workers: Annotated[
        str, typer.Option(help="With --disagg: decode workers per unit to consider, comma-separated.")
    ] = "1,2,4",
    links: Annotated[
        str,
        typer.Option(help="With --disagg: links to consider (kvplan/sizing/data/links.yaml), comma-separated."),
    ] = "rdma-400g",
    prefill_tp: Annotated[
        str | None, typer.Option(help="With --disagg: prefill workers' tps, comma-separated (default: --tp's).")
    ] = None,
    decode_tp: Annotated[
        str | None, typer.Option(help="With --disagg: decode workers' tps, comma-separated (default: --tp's).")
    ] = None,
    prefill_max_num_seqs: Annotated[
        str | None,
        typer.Option(help="With --disagg: prefill workers' max_num_seqs, comma-separated (default: --max-num-seqs's)."),
    ] = None,
    prefill_max_num_batched_tokens: Annotated[
        str | None,
        typer.Option(
            help="With --disagg: prefill workers' token budgets per step, comma-separated"
            " (default: --max-num-batched-tokens's)."
        ),
    ] = None,
) -> None:
    # one line: `kvplan --help` shows this paragraph's line breaks as they are written
    """Search GPU kind, TP, dtypes and scheduler limits for the cheapest deployment that serves --rate (or --users) of the workload's traffic within its SLO: per-replica SLO capacity by simulation, replicas, GPUs, cost."""  # noqa: E501
    from kvplan.optimize import plan as planning
    from kvplan.optimize.plan_run import PlanRequest, plan_deployments

    simulation_gc()
    given_only_with(ctx, _DISAGG_OPTIONS, "disagg", disagg)
    given_only_with(ctx, ("scale_up_s", "window_requests"), "window", window is not None)
    request = PlanRequest(
        workload=workload,
        rate=rate,
        users=users,
        model=model,
        gpus=planning.DEFAULT_GPUS if gpus is None else _split(gpus),
        max_gpus=max_gpus,
        tp=tuple(_ints(tp, "tp")),
        kv_cache_dtypes=_split(kv_cache_dtype),
        weight_dtypes=_split(weight_dtype),
        max_num_seqs=tuple(_ints(max_num_seqs, "max_num_seqs")),
        max_num_batched_tokens=tuple(_ints(max_num_batched_tokens, "max_num_batched_tokens")),
        bucket=bucket,
        prices=prices,
        jobs=jobs if jobs is not None else os.cpu_count() or 1,
        ray=ray,
        out=out,
        attainment=attainment,
        pareto=pareto,
        window_s=window,
        scale_up_s=scale_up_s,
        window_requests=window_requests,
        disagg=disagg,
        prefill_workers=tuple(_ints(prefill_workers, "prefill_workers")),
        decode_workers=tuple(_ints(decode_workers, "decode_workers")),
        links=_split(links),
        prefill_tp=_maybe_ints(prefill_tp, "prefill_tp"),
        decode_tp=_maybe_ints(decode_tp, "decode_tp"),
        prefill_max_num_seqs=_maybe_ints(prefill_max_num_seqs, "prefill_max_num_seqs"),
        prefill_max_num_batched_tokens=_maybe_ints(prefill_max_num_batched_tokens, "prefill_max_num_batched_tokens"),
        host_offload_gib=_floats(host_offload_gib, "host_offload_gib"),
    )
    console = make_console()
    outcome = plan_deployments(request, lambda total: _progress(console, total, quiet=json_output), warn)
    run, run_dir = outcome.run, outcome.run_dir
    cut = (len(run.configs), run.num_configs) if run.interrupted else None
    if cut:
        print(f"interrupted: {cut[0]} of {cut[1]} configurations finished, kept in {run_dir}", file=sys.stderr)
    if json_output:
        print(run.model_dump_json(indent=2))
    else:
        from kvplan.results.report.plan_view import print_plan

        print_plan(run.configs, run.model, run.load, console, interrupted=cut)
        if run.windows is not None:
            from kvplan.results.report.plan_view import print_windows

            print_windows(run.windows, console)
        for verdict in (run.disagg_verdict, run.offload_verdict):
            if verdict:
                console.print(verdict, markup=False, highlight=False, soft_wrap=True)
        console.print(f"report: {run_dir}", markup=False, highlight=False)
    if run.interrupted:
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
