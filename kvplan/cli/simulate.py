"""``kvplan simulate``: the workload through the engine's own scheduler on a cost-model clock."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvplan.cli.app import exit_interrupted, left_to_exit, make_console, simulation_gc, warn


def simulate(
    workload: Annotated[Path, typer.Argument(help="Workload YAML, e.g. workloads/chat.yaml.")],
    out: Annotated[Path | None, typer.Option(help="Report folder (default: reports/<name>-<timestamp>/).")] = None,
    calibrate: Annotated[
        Path | None,
        typer.Option(
            help="A load test's run folder of this engine to fit the step time on (default: the calibration"
            " shipped for the engine)."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Simulate this model (preset, config.json or .gguf) on --gpu instead of the engine section's"
            " model and pool."
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(help="GPU to simulate --model on, timed by its FLOP/s and bandwidth (the GPU table's names)."),
    ] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel size on --gpu.")] = 1,
    kv_cache_dtype: Annotated[
        str, typer.Option(help="KV dtype on --gpu: auto (model dtype), fp16, bf16, fp8.")
    ] = "auto",
    weight_dtype: Annotated[
        str,
        typer.Option(
            help="Weight dtype on --gpu: auto (checkpoint), bf16, fp16, fp8, int8, int4, nvfp4 (alias fp4), mxfp4."
        ),
    ] = "auto",
    gpu_memory_utilization: Annotated[
        float | None, typer.Option(help="Fraction of --gpu's memory the server may use (default 0.9, vLLM's).")
    ] = None,
    backend: Annotated[
        str,
        typer.Option(
            help="Serving engine whose measured operation times (aiconfigurator-core) time steps on --gpu:"
            " vllm, sglang, trtllm."
        ),
    ] = "vllm",
    backend_version: Annotated[
        str | None,
        typer.Option(
            help="The --backend database version (default: the one aiconfigurator-core maintains as current)."
        ),
    ] = None,
    ep: Annotated[
        int, typer.Option(help="Expert-parallel size on --gpu for a MoE model (experts split --ep ways of --tp).")
    ] = 1,
    dp: Annotated[
        int,
        typer.Option(
            help="Attention data-parallel size on --gpu for a MoE model: each instance --tp x --dp GPUs, its"
            " attention --dp batches, its experts over all of them."
        ),
    ] = 1,
    step_times: Annotated[
        str,
        typer.Option(
            help="How --gpu steps are timed: auto (measured silicon where aiconfigurator-core covers the GPU,"
            " backend and model, else the roofline), silicon, roofline."
        ),
    ] = "auto",
    tokenize_us_per_token: Annotated[
        float,
        typer.Option(
            help="On --gpu, the server's tokenizer thread, us per prompt token, for a client that sends text"
            " prompts: each request queues for it before the scheduler (vLLM's: 3.3, measured; 0: none)."
        ),
    ] = 0.0,
    replay: Annotated[
        Path | None,
        typer.Option(
            help="Time every step as this measured run of the workload did (the simulator's exactness check)."
        ),
    ] = None,
    attainment: Annotated[
        float,
        typer.Option(help="SLO attainment target of the capacity search: the fraction of requests meeting every SLO."),
    ] = 0.95,
    charts: Annotated[
        bool, typer.Option(help="Draw the report's PNG charts too (seconds; `kvplan report DIR` draws them later).")
    ] = False,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON object (the shape of `kvplan report --json`) instead of tables."),
    ] = False,
    quiet: Annotated[bool, typer.Option(help="No tables: print only the report folder.")] = False,
) -> None:
    # one line: `kvplan --help` shows this paragraph's line breaks as they are written
    """Replay the workload's requests through the engine's own scheduler on a cost-model clock: the knee, latency and SLO capacity, in seconds, without a model or a GPU."""  # noqa: E501
    from kvplan.results.run_result import read_result
    from kvplan.run.sim.cli_setup import setups_for
    from kvplan.run.sim.run import simulate as run_simulate
    from kvplan.workload.file import load_workload

    simulation_gc()

    console = make_console()
    spec = load_workload(workload)
    warn(spec.warnings, spec.source)
    setup, plan, calibrated = setups_for(
        spec,
        calibrate=calibrate,
        model=model,
        gpu=gpu,
        tp=tp,
        kv_cache_dtype=kv_cache_dtype,
        weight_dtype=weight_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        replay=replay,
        attainment=attainment,
        backend=backend,
        backend_version=backend_version,
        ep=ep,
        step_times=step_times,
        dp=dp,
        tokenize_us_per_token=tokenize_us_per_token,
    )
    warn([note for s in (setup, *plan) for note in s.notes], spec.source)
    if calibrated is not None and not (json_output or quiet):
        from kvplan.run.sim.calibration.view import print_calibration

        print_calibration(calibrated, console)
    elif calibrated is not None:  # the drift warning goes to stderr whatever else is quiet
        warn([d.describe() for d in calibrated.drift], str(calibrate))
    note = lambda line: warn([line], spec.source)  # noqa: E731
    run_dir = run_simulate(
        spec, setup, out, plan=plan, attainment=attainment, charts=charts, note=note, keep=left_to_exit()
    )
    result = read_result(run_dir)
    if json_output:
        import json

        from kvplan.results.summary_json import summary_json

        print(json.dumps(summary_json(result), indent=2))
    else:
        if not quiet:
            from kvplan.results.report.render import print_summary

            print_summary(result, console)
        console.print(f"report: {run_dir}", markup=False, highlight=False)
    if result.status == "interrupted":  # Ctrl-C: exits as SIGINT does, as kvplan loadtest, whatever it kept
        exit_interrupted(run_dir)
