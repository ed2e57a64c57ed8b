"""``kvplan advise``: which KV optimisation pays for this traffic (kvplan.optimize.advise)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvplan.cli.app import make_console, simulation_gc, warn


def advise(
    workload: Annotated[Path, typer.Argument(help="Workload YAML, e.g. workloads/shared_prefix.yaml.")],
    model: Annotated[
        str | None, typer.Option(help="Advise for this model (preset, config.json or .gguf) on --gpu.")
    ] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU to simulate --model on (the GPU table's names).")] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel size on --gpu.")] = 1,
    kv_cache_dtype: Annotated[
        str, typer.Option(help="KV dtype on --gpu as it is: auto (model dtype), fp16, bf16, fp8.")
    ] = "auto",
    weight_dtype: Annotated[
        str, typer.Option(help="Weight dtype on --gpu: auto (checkpoint), bf16, fp16, fp8, int8, int4, nvfp4, mxfp4.")
    ] = "auto",
    backend: Annotated[
        str, typer.Option(help="Serving engine whose measured operation times time --gpu steps: vllm, sglang, trtllm.")
    ] = "vllm",
    calibrate: Annotated[
        Path | None,
        typer.Option(help="A load test's run folder of this engine to fit the step time on (the engine only)."),
    ] = None,
    attainment: Annotated[
        float, typer.Option(help="SLO attainment target: the fraction of requests meeting every SLO.")
    ] = 0.95,
    fp8_quality: Annotated[
        bool,
        typer.Option(
            help="Also run the fp8 KV quality check on the bundled engine (the workload's model, KV in its dtype"
            " against fp8: greedy agreement, KL, top-1), the fp8 row's condition; loads the model (seconds to"
            " minutes). Not with --gpu."
        ),
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
) -> None:
    # one line: `kvplan --help` shows this paragraph's line breaks as they are written
    """Simulate the workload's traffic as it is and with each KV optimisation (prefix caching, fp8 KV, the chunked-prefill budget, max_num_seqs, block size, disaggregation) and say which pays: SLO capacity, goodput and KV pool side by side."""  # noqa: E501
    from kvplan.optimize.advise import advise as run_advise
    from kvplan.run.sim.cli_setup import setups_for
    from kvplan.run.sim.facts import simulated_facts
    from kvplan.run.sim.setups import SimSetup
    from kvplan.workload.file import load_workload
    from kvplan.workload.schema import Workload

    simulation_gc()
    spec = load_workload(workload)
    warn(spec.warnings, spec.source)
    if spec.variants or any(b.variants for b in spec.buckets):
        warn(
            ["variants: kvplan advise judges the engine section alone; the workload's variants are not used"],
            spec.source,
        )
    on_gpu = gpu is not None
    base: list[SimSetup] = []

    def setup_for(changed: Workload, alt_kv: str | None) -> SimSetup:
        """A GPU target is set up anew per alternative; the workload's engine keeps the base
        calibration's clock unless its KV dtype changes (which has a calibration of its own), its
        offload tiers change (the clock prices their loads) or either is disaggregated (two pools:
        set up anew)."""

        def setup(kv: str, calibration: Path | None) -> SimSetup:
            return setups_for(
                changed,
                model=model,
                gpu=gpu,
                tp=tp,
                kv_cache_dtype=kv,
                weight_dtype=weight_dtype,
                backend=backend,
                attainment=attainment,
                calibrate=calibration,
            )[0]

        if on_gpu:
            return setup(alt_kv or kv_cache_dtype, None)
        same_kv = changed.engine.kv_cache_dtype == spec.engine.kv_cache_dtype
        same_tiers = changed.engine.offload == spec.engine.offload
        if base and same_kv and same_tiers and changed.engine.disagg is None and base[0].make_backend is None:
            facts = simulated_facts(changed, base[0].facts.device, base[0].facts.attention_backend)
            return base[0].with_facts(facts)
        own = setup(kv_cache_dtype, calibrate)
        if not base:
            base.append(own)
        return own

    if fp8_quality and on_gpu:
        from kvplan.errors import KvplanError

        raise KvplanError(
            "fp8_quality",
            "runs on the bundled engine, the workload's own model, not on --gpu",
            "drop --fp8-quality, or advise the workload's engine",
        )
    advice = run_advise(spec, setup_for, on_gpu=on_gpu, kv_cache_dtype=kv_cache_dtype, attainment=attainment)
    if fp8_quality:
        advice = _with_fp8_quality(advice, spec)
    if json_output:
        print(advice.model_dump_json(indent=2))
        return
    from kvplan.optimize.advise_view import print_advice

    print_advice(advice, make_console())


def _with_fp8_quality(advice, spec):
    """``advice`` with the fp8 row's condition measured: the bundled engine's fp8 quality check on
    the workload (kvplan.run.bundled.fp8_quality, at its ``fp8_quality`` size)."""
    from kvplan.run.bundled.backend import build_engine, tokenizer_function
    from kvplan.run.bundled.fp8_quality import check_for_run
    from kvplan.traffic.prompts import sample_buckets

    engine = build_engine(spec)
    sampled = sample_buckets(spec, tokenizer_function(engine), engine.hf_config.vocab_size).requests
    q = check_for_run(engine, spec, sampled)
    measured = (
        f"measured on {q.model}: top-1 agreement {q.top1_agreement:.1%}, mean KL {q.mean_kl:.3g} (max {q.max_kl:.3g})"
        f" over {q.num_kl_positions} positions, greedy exact match {q.exact_match_rate:.0%} of {q.num_prompts}"
        f" prompts ({q.prompts})"
    )
    rows = [
        row.model_copy(update={"condition": f"{row.condition}; {measured}"}) if row.name == "fp8 KV cache" else row
        for row in advice.alternatives
    ]
    return advice.model_copy(update={"alternatives": rows})
