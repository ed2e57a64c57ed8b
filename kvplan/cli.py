"""The `kvplan` command line: one typer app, one thin function per command.

Each command parses its options, calls one library function and renders the result. Heavy imports
(torch, transformers, pandas, matplotlib) stay inside the command bodies that need them, so
`kvplan --help` and `kvplan estimate` start fast. To add a command: one more ``@app.command()``
function here. Bad input raises :class:`kvplan.errors.KvplanError`; :func:`main` prints it as one
red line on stderr and exits 2. Library errors name an option by its field (``kv_cache_dtype``);
only here does it become the flag the user typed (``--kv-cache-dtype``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvplan.errors import KvplanError
from kvplan.plan.capacity import DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_OVERHEAD_GIB

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="KV-cache capacity planning for LLM serving.",
)


def main() -> None:
    """Console-script entry point. Bad input becomes one red line on stderr and exit 2, no
    traceback: a KvplanError, or a usage error typer raises (unknown option, a value of the wrong
    type). A command's ``typer.Exit(code)`` becomes the exit code; Ctrl-C outside a load test, 130."""
    try:
        code = app(standalone_mode=False, prog_name="kvplan")
    except KvplanError as err:
        _error_line(err.render(_flag))
        sys.exit(err.exit_code)
    except typer.TyperException as err:  # typer's public base of its usage errors
        if type(err).__name__ == "NoArgsIsHelpError":  # plain `kvplan`: the help is the answer
            err.show()
        else:
            _error_line(f"{err.format_message().rstrip('.')}; see `{_command_path(err)} --help`")
        sys.exit(getattr(err, "exit_code", 2))
    except typer.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


@app.callback()
def _root() -> None:
    """KV-cache capacity planning for LLM serving: estimate, measure, report, gate."""


def _command_path(err: typer.TyperException) -> str:
    """``kvplan estimate`` for a usage error in that command. Some parse errors (an option
    missing its value) carry no context: then the first word of argv that names a command."""
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        return ctx.command_path
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    word = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    return f"kvplan {word}" if word in names else "kvplan"


def _flag(field: str) -> str | None:
    """``kv_cache_dtype`` -> ``--kv-cache-dtype`` when some command has that option (else None)."""
    import typer.main

    group = typer.main.get_command(app)
    for command in getattr(group, "commands", {}).values():
        for param in command.params:
            if param.name == field and param.opts and param.opts[0].startswith("--"):
                return param.opts[0]
    return None


def _error_line(message: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"error: {message}", style="red", markup=False, highlight=False, soft_wrap=True)


def _console():
    """A rich Console for tables. Piped into a file or a CI log there is no terminal width to fit
    (rich would assume 80 columns and cut the tables): keep each row on one line instead."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 140))


def _int_list(text: str | None, flag: str) -> tuple[int, ...]:
    """``"8192,32k,1M"`` -> (8192, 32768, 1048576): a ``k`` suffix means x1024 tokens, ``m``
    x1024**2, either case; None (option not given) -> ().

    Raises:
        KvplanError: an empty list, or an entry that is not a whole number (quoted as typed).
    """
    if text is None:
        return ()
    example = "1,8,32" if flag == "--batch" else "8192,32k,128k"
    if not text.strip():
        raise KvplanError(flag, "the list is empty", f"give numbers like {example}, or leave the option out")
    values = []
    for part in (part.strip() for part in text.split(",")):
        scale = {"k": 2**10, "m": 2**20}.get(part[-1:].lower(), 1)
        try:
            values.append(int(part[:-1] if scale > 1 else part) * scale)
        except ValueError:
            raise KvplanError(flag, f"{part!r} is not a whole number", f"give numbers like {example}") from None
    return tuple(values)


@app.command()
def estimate(
    model: Annotated[str, typer.Option(help="Preset name or Hugging Face id (case-insensitive), config.json path or folder, or .gguf file.")],
    gpu: Annotated[Optional[str], typer.Option(help="GPU from the bundled table, by exact name or alias (H100-SXM, H100-PCIe, H100-NVL, H20, H200, GH200, B200, A100-80GB, L40S, MI300X, MI325X, RTX-4090, ...); an unknown name lists the closest.")] = None,
    gpu_memory_gib: Annotated[Optional[float], typer.Option(help="GPU memory in GiB, instead of --gpu.")] = None,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(help=f"Fraction of GPU memory the server may use (default {DEFAULT_GPU_MEMORY_UTILIZATION}, vLLM's).")] = None,
    kv_memory_gib: Annotated[Optional[float], typer.Option(help="KV pool size in GiB per GPU, as vLLM prints it, instead of the budget arithmetic (then no --weights-gib, --overhead-gib or --gpu-memory-utilization).")] = None,
    weights_gib: Annotated[Optional[float], typer.Option(help="Weight memory per GPU in GiB, instead of parameters counted from the config.")] = None,
    weight_dtype: Annotated[str, typer.Option(help="Weight dtype: auto (checkpoint dtype or quantization), fp32, fp16, bf16, fp8, int8, int4.")] = "auto",
    overhead_gib: Annotated[Optional[float], typer.Option(help=f"Non-KV reserve per GPU in GiB: activation peak, CUDA context, graphs (default {DEFAULT_OVERHEAD_GIB}; vLLM logs show 1-3 GiB).")] = None,
    kv_cache_dtype: Annotated[str, typer.Option(help="KV dtype: auto (model dtype), fp32, fp16, bf16, fp8, int8, int4.")] = "auto",
    tp: Annotated[int, typer.Option(help="Tensor-parallel size.")] = 1,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel size.")] = 1,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = DEFAULT_BLOCK_SIZE,
    max_model_len: Annotated[Optional[int], typer.Option(help="Longest request in tokens, at most the model's limit (default: that limit, its max_position_embeddings).")] = None,
    context: Annotated[Optional[str], typer.Option(help="Context lengths for the grid, e.g. 8192,32k,1m (k = 1024 tokens; default: max_model_len).")] = None,
    batch: Annotated[str, typer.Option(help="Batch sizes for the grid, e.g. 1,8,32.")] = "1",
    shared_prefix_tokens: Annotated[int, typer.Option(help="Tokens of a prefix every request shares; its full blocks count once per batch.")] = 0,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG of KV GiB against context per batch size, with the KV budget.")] = None,
) -> None:
    """KV bytes per token, per request and per batch, and what fits on a GPU (per GPU rank)."""
    from kvplan.plan.estimate import estimate as run_estimate
    from kvplan.plan.estimate_plot import check_plot_path
    from kvplan.plan.model_source import load_model_spec

    if plot is not None:
        check_plot_path(plot)  # before the work, so a bad path costs nothing
    spec = load_model_spec(model)
    result = run_estimate(
        spec,
        contexts=_int_list(context, "--context"),
        batch_sizes=_int_list(batch, "--batch"),
        shared_prefix_tokens=shared_prefix_tokens,
        kv_cache_dtype=kv_cache_dtype,
        tp=tp,
        pp=pp,
        block_size=block_size,
        max_model_len=max_model_len,
        gpu=gpu,
        gpu_memory_gib=gpu_memory_gib,
        gpu_memory_utilization=gpu_memory_utilization,
        weights_gib=weights_gib,
        weight_dtype=weight_dtype,
        overhead_gib=overhead_gib,
        kv_memory_gib=kv_memory_gib,
    )
    if plot is not None:
        from kvplan.plan.estimate_plot import save_estimate_plot

        save_estimate_plot(result, plot)
    if json_output:
        import json

        print(json.dumps(result.to_dict(), indent=2))
    else:
        from kvplan.plan.estimate_view import render_estimate

        render_estimate(result, spec, _console())
    if plot is not None:  # on stderr with --json, so that stdout stays one JSON object
        typer.echo(f"plot: {plot}", err=json_output)


@app.command()
def loadtest(
    workload: Annotated[Path, typer.Argument(help="Workload YAML, e.g. workloads/chat.yaml.")],
    out: Annotated[Optional[Path], typer.Option(help="Report folder (default: reports/<name>-<timestamp>/).")] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bars or tables: print only the report folder.")] = False,
    target: Annotated[Optional[str], typer.Option(help="Load-test a running OpenAI-compatible server at this base URL (http://HOST:PORT/v1) instead of the bundled engine; overrides the workload's target.url.")] = None,
    model: Annotated[Optional[str], typer.Option(help="With a target: the served model for kvplan's KV estimate (preset, config.json or GGUF); overrides target.estimate_model.")] = None,
) -> None:
    """Run a workload's buckets and load levels on the bundled engine, or on a remote server (--target); write the report folder (Ctrl-C keeps what finished, exit 130)."""
    from kvplan.load.workload_file import load_workload
    from kvplan.results.report.render import print_summary
    from kvplan.results.run_result import read_result

    console = _console()
    spec = load_workload(workload)
    _warn(spec.warnings, spec.source)
    if target is not None or model is not None or spec.target is not None:
        from kvplan.load.target_run import run_target_loadtest
        from kvplan.load.workload_file import with_target

        spec, url_field = with_target(spec, target, model)
        run_dir = run_target_loadtest(spec, out, url_field=url_field, console=None if quiet else console)
    else:
        from kvplan.load.loadtest import run_loadtest

        run_dir = run_loadtest(spec, out, console=None if quiet else console)
    result = read_result(run_dir)
    if not quiet:
        print_summary(result, console)
    console.print(f"report: {run_dir}", markup=False, highlight=False)
    if result.stop_reason:  # the server went away: a valid partial report, and a failed command
        _error_line(f"stopped: {result.stop_reason}; the report keeps the requests that finished ({run_dir})")
        raise typer.Exit(1)
    if result.status == "interrupted":  # a stopped run exits as SIGINT does, whatever it kept
        from rich.console import Console

        Console(stderr=True).print(f"interrupted: the report keeps the requests that finished ({run_dir})",
                                   style="yellow", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(130)


@app.command()
def simulate(
    workload: Annotated[Path, typer.Argument(help="Workload YAML, e.g. workloads/chat.yaml.")],
    out: Annotated[Optional[Path], typer.Option(help="Report folder (default: reports/<name>-<timestamp>/).")] = None,
    calibrate: Annotated[Optional[Path], typer.Option(help="A load test's run folder of this engine to fit the step time on (default: the calibration shipped for the engine).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Simulate this model (preset, config.json or .gguf) on --gpu instead of the engine section's model and pool.")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="GPU to simulate --model on, timed by its FLOP/s and bandwidth (the GPU table's names).")] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel size on --gpu.")] = 1,
    kv_cache_dtype: Annotated[str, typer.Option(help="KV dtype on --gpu: auto (model dtype), fp16, bf16, fp8.")] = "auto",
    weight_dtype: Annotated[str, typer.Option(help="Weight dtype on --gpu: auto (checkpoint), bf16, fp16, fp8, int8, int4.")] = "auto",
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(help="Fraction of --gpu's memory the server may use (default 0.9, vLLM's).")] = None,
    replay: Annotated[Optional[Path], typer.Option(help="Time every step as this measured run of the workload did (the simulator's exactness check).")] = None,
    attainment: Annotated[float, typer.Option(help="SLO attainment target of the capacity search: the fraction of requests meeting every SLO.")] = 0.95,
    charts: Annotated[bool, typer.Option(help="Draw the report's PNG charts too (seconds; `kvplan report DIR` draws them later).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object (the shape of `kvplan report --json`) instead of tables.")] = False,
    quiet: Annotated[bool, typer.Option(help="No tables: print only the report folder.")] = False,
) -> None:
    """Replay the workload's requests through the engine's own scheduler on a cost-model clock: the knee, latency and SLO capacity, in seconds, without a model or a GPU."""
    from kvplan.load.sim.cli_setup import setups_for
    from kvplan.load.sim.run import simulate as run_simulate
    from kvplan.load.workload_file import load_workload
    from kvplan.results.run_result import read_result

    console = _console()
    spec = load_workload(workload)
    _warn(spec.warnings, spec.source)
    setup, plan, calibrated = setups_for(spec, calibrate=calibrate, model=model, gpu=gpu, tp=tp,
                                         kv_cache_dtype=kv_cache_dtype, weight_dtype=weight_dtype,
                                         gpu_memory_utilization=gpu_memory_utilization, replay=replay,
                                         attainment=attainment)
    if calibrated is not None and not (json_output or quiet):
        from kvplan.load.sim.views import print_calibration

        print_calibration(calibrated, console)
    elif calibrated is not None:  # the drift warning goes to stderr whatever else is quiet
        _warn([d.describe() for d in calibrated.drift], str(calibrate))
    run_dir = run_simulate(spec, setup, out, plan=plan, attainment=attainment, charts=charts)
    result = read_result(run_dir)
    if json_output:
        import json

        from kvplan.results.summary_json import summary_json

        print(json.dumps(summary_json(result), indent=2))
        return
    if not quiet:
        from kvplan.results.report.render import print_summary

        print_summary(result, console)
    console.print(f"report: {run_dir}", markup=False, highlight=False)


def _warn(lines, source: str) -> None:
    from rich.console import Console

    for line in lines:
        Console(stderr=True).print(f"warning: {source}: {line}", style="yellow", markup=False, highlight=False,
                                   soft_wrap=True)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run folder written by kvplan loadtest.")],
    json_output: Annotated[bool, typer.Option("--json", help="Print the run's summary as one JSON object (the shape in the README) instead of re-rendering it.")] = False,
    compare: Annotated[Optional[Path], typer.Option(help="Another run folder to set this one against, level by level (as `kvplan compare RUN_DIR COMPARE`).")] = None,
) -> None:
    """Re-render summary.md, the CSV tables and the charts of a saved run, without re-running it."""
    if compare is not None:
        from kvplan.results.run_result import read_result

        read_result(compare)  # a bad second folder fails before anything is written
    if json_output:  # the views are left as they are; only a comparison asked for is written
        import json

        from kvplan.results.run_result import check_records, load_run, read_result
        from kvplan.results.summarize import summarize
        from kvplan.results.summary_json import summary_json

        result = read_result(run_dir)
        if not result.summarized:  # a run killed before its summaries: computed from the records, not saved
            data = load_run(run_dir)
            check_records(data)
            result = summarize(data.result, data.requests, data.steps)
        if compare is not None:
            _compare(run_dir, compare, quiet=True)
        print(json.dumps(summary_json(result), indent=2))
        return
    from kvplan.results.report.render import print_summary, render_report

    data = render_report(run_dir)
    if compare is not None:
        _compare(run_dir, compare)
    console = _console()
    print_summary(data.result, console)
    console.print(f"report: {run_dir}", markup=False, highlight=False)


@app.command(name="compare")
def compare_runs(
    run_a: Annotated[Path, typer.Argument(help="Run folder A (e.g. a simulation).")],
    run_b: Annotated[Path, typer.Argument(help="Run folder B to set A against (e.g. the measured run); error % = (A - B) / B.")],
) -> None:
    """Two runs side by side, level by level: each metric of A and B with A's error in %, a table and a PNG per metric in A/compare-<B>/."""
    _compare(run_a, run_b)


def _compare(run_a: Path, run_b: Path, quiet: bool = False) -> None:
    from kvplan.results.report.compare import wide_table, write_comparison
    from kvplan.results.report.tables import to_rich

    out, frame = write_comparison(run_a, run_b)
    if quiet:
        return
    console = _console()
    for title, metrics in (("latency P50 / P95 (ms)", ("TTFT P50 ms", "TTFT P95 ms", "TPOT P50 ms", "TPOT P95 ms")),
                           ("throughput, goodput and KV", ("output tok/s", "goodput req/s", "preemptions",
                                                           "peak used blocks"))):
        console.print(to_rich(wide_table(frame, metrics), f"A {run_a} vs B {run_b}: {title}; err % = (A - B) / B"))
    console.print(f"comparison: {out}", markup=False, highlight=False)


@app.command()
def gate(
    run_dir: Annotated[Path, typer.Argument(help="A run folder written by kvplan loadtest.")],
    baseline: Annotated[Path, typer.Option(help="Baseline YAML, e.g. baselines/ci.yaml.")],
    update_baseline: Annotated[bool, typer.Option(help="Write this run as the new baseline (keeping the file's tolerances) instead of comparing.")] = False,
    junit: Annotated[Optional[Path], typer.Option(help="Also write JUnit XML here: one test case per check.")] = None,
) -> None:
    """Compare a run with a baseline, metric by metric: exit 0 when every check holds, 1 on any regression, 2 on bad input."""
    from kvplan.gate.gate import record_baseline, run_gate

    console = _console()
    if update_baseline:
        if junit is not None:
            raise KvplanError("junit", "there are no checks to write with `update_baseline`", "drop one of the two")
        path, count = record_baseline(run_dir, baseline)
        console.print(f"baseline written: {path} ({count} values from {run_dir})", markup=False, highlight=False,
                      soft_wrap=True)
        return
    from kvplan.gate.view import render_gate, write_junit

    result = run_gate(run_dir, baseline)
    if junit is not None:
        write_junit(result, junit)
    render_gate(result, console)
    raise typer.Exit(result.exit_code)


@app.command()
def schema(
    which: Annotated[str, typer.Argument(help="workload (the workload YAML) or results (a run folder's results.json).")],
) -> None:
    """Print the JSON Schema (draft 2020-12) of the workload YAML or of results.json, for editors and CI validators."""
    import json

    from kvplan.schemas import json_schema

    print(json.dumps(json_schema(which), indent=2))
