"""``kvplan loadtest``: a workload on the bundled engine, every stage saved before the next starts.

::

    workload -> engine (EngineFacts) -> sampled requests -> every request fits? (checks)
      -> concurrency: auto resolved around the simulated knee -> fp8 scales (calibration)
      -> estimate (+ each bucket's knee, the engine's scheduler simulated at every concurrency)
      -> run folder with results.json (status running)
      -> for bucket, for level: driver + EngineBackend, records appended as they happen
      -> fp8 quality check -> summaries (status complete | interrupted) -> report

Bad input stops before the run folder exists, so it leaves nothing behind. Ctrl-C during the
levels stops at once and keeps a valid report of the requests that finished (status
interrupted; a level it cut short is marked partial); Ctrl-C while the report is written raises
``ReportInterrupted``. The run folder's stages are kvplan.run.lifecycle's, shared by every kind of
run; this module is the one place where two kinds meet: the bundled engine's run, with each
bucket's knee simulated on the engine's own scheduler (kvplan.run.sim.search) beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.results.run_result import EngineFacts, RunResult, WorkloadRef
from kvplan.results.store import check_out
from kvplan.run.bundled.backend import (
    EngineBackend,
    backend_for,
    build_engine,
    engine_facts,
    run_info,
    tokenizer_function,
    warm_up,
)
from kvplan.run.checks import check_requests_fit, check_shortest_fits, fit_check
from kvplan.run.driver import schedule_levels
from kvplan.run.estimate import compute_estimate, plan_target
from kvplan.run.lifecycle import finish_run, now_iso, run_levels, start_run
from kvplan.run.sim.search import resolve_auto, simulated_knees, with_knees
from kvplan.traffic.prompts import sample_buckets
from kvplan.workload.schema import Workload
from kvplan.workload.trace import check_replay
from kvplan.workload.variants import all_variants, variant_workload


def run_loadtest(workload: Workload, run_dir: Path | None = None, *, engine=None, console=None) -> Path:
    """Run ``workload`` on the bundled engine and write its report folder; returns the folder.
    results.json's status says how it ended: complete, or interrupted (Ctrl-C during the levels
    or the fp8 check).

    engine: an already built engine to reuse (tests); by default one is built from
        ``workload.engine``. console: a rich Console for progress bars and notes (None: silent).

    Raises:
        KvplanError: an ``out`` that cannot be a new run folder, engine settings the engine
            refuses, a model that cannot load, prompts that cannot fill a bucket, a sampled
            request the engine could never run, a plan target kvplan does not know; all before
            the run folder exists.
        ReportInterrupted: Ctrl-C after the levels, while the summaries or report were written.
    """
    say = console.print if console is not None else (lambda *a, **k: None)
    started = now_iso()
    for index in range(len(workload.plan)):  # a bad plan target fails before the model loads
        plan_target(workload, index, {})
    check_out(run_dir)
    check_replay(workload)  # a trace replayed whole: at most a level's 24 h
    say(f"[dim]loading {workload.engine.model}...[/dim]")
    engine = engine or build_engine(workload)
    facts = engine_facts(engine)
    vocab_size = facts.vocab_size
    assert vocab_size is not None  # engine_facts reads it from the model's config
    check_shortest_fits(workload, facts)  # before drawing prompts no request of the bucket could use
    sampled = sample_buckets(workload, tokenizer_function(engine), vocab_size, fit_check(workload, facts))
    check_requests_fit(workload, facts, sampled.requests)
    workload = resolve_auto(workload, facts, sampled.requests)  # concurrency: auto -> levels around the knee
    if "num_conversations" in sampled.dataset_info:
        say(f"[dim]sharegpt: read {sampled.dataset_info['num_conversations']:,} whole conversations[/dim]")
    is_fp8 = facts.kv_cache_dtype == "fp8"
    if is_fp8:  # scales from a few of the run's own prompts, set before the first step
        from kvplan.run.bundled.fp8_quality import calibrate_for_run

        facts = facts.model_copy(update={"kv_scales": calibrate_for_run(engine, workload, sampled.requests)})
    estimate, pricing = compute_estimate(workload, facts, sampled.requests)
    if workload.engine.disagg is None:  # a disaggregated engine has no one pool to find a knee in
        estimate = with_knees(estimate, simulated_knees(workload, facts, sampled.requests))
    variants = _variant_engines(workload, engine, sampled.requests, say)
    result = RunResult(
        started_at=started,
        slo=workload.slo,
        level_plans=workload.level_plans,
        class_slos=workload.class_slos,
        variant_engines={name: v[2] for name, v in variants.items()},
        engine=facts,
        estimate=estimate,
        run=run_info(sampled.dataset_info),
        workload=WorkloadRef(
            name=workload.name, source=workload.source, sha256=workload.sha256, config=workload.model_dump(mode="json")
        ),
    )
    for warmed in {id(e): e for e in (engine, *(v[0].engine for v in variants.values()))}.values():
        warm_up(warmed)  # each engine's one-time costs before its first level, not in it
    run_dir = start_run(workload, result, run_dir)
    status = run_levels(
        backend_for(engine),
        schedule_levels(workload, sampled.requests),
        run_dir,
        pricing.step_bytes,
        workload.seed,
        console,
        variant_backend=lambda name: variants[name][:2],
    )
    if is_fp8 and status == "complete" and workload.fp8_quality.num_prompts:
        from kvplan.run.bundled.fp8_quality import check_for_run

        say(f"[dim]fp8 quality check on {workload.fp8_quality.num_prompts} prompts...[/dim]")
        try:
            result = result.model_copy(update={"fp8_quality": check_for_run(engine, workload, sampled.requests)})
        except KeyboardInterrupt:  # every level is whole; the check is not
            status = "interrupted"
            say("[yellow]interrupted: no fp8 quality check; writing the report[/yellow]")
    return finish_run(run_dir, result, status)


def _variant_engines(workload: Workload, base, sampled: dict, say) -> dict[str, tuple[EngineBackend, Any, EngineFacts]]:
    """Every engine variant's (backend, KV sizes of a step, engine facts), built before the run
    folder exists so a setting the engine refuses, or a request a variant's pool cannot fit, stops
    the run first (errors name the variant). A variant that changes nothing runs on ``base``."""
    out: dict[str, tuple[EngineBackend, Any, EngineFacts]] = {}
    for name in all_variants(workload):
        own = variant_workload(workload, name)
        engine = base
        if own.engine != workload.engine:
            say(f"[dim]building engine variant {name}...[/dim]")
            try:
                engine = build_engine(own)
            except KvplanError as err:
                raise KvplanError(f"variants {name}: {err.field}", err.problem, err.fix, source=err.source) from None
        facts = engine_facts(engine)
        check_requests_fit(own, facts, sampled)
        if facts.kv_cache_dtype == "fp8" and engine is not base:
            from kvplan.run.bundled.fp8_quality import calibrate_for_run

            facts = facts.model_copy(update={"kv_scales": calibrate_for_run(engine, own, sampled)})
        pricing = compute_estimate(own.model_copy(update={"plan": []}), facts, sampled)[1]
        out[name] = (EngineBackend(engine), pricing.step_bytes, facts)
    return out
