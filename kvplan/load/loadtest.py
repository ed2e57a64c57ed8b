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
``ReportInterrupted``. ``start_run`` and ``finish_run`` are the stages every kind of run shares.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.load.backends.engine import EngineBackend, build_engine, engine_facts, run_info, tokenizer_function
from kvplan.load.checks import check_requests_fit
from kvplan.load.driver import Backend, Level, Recorder, RunStopped, plan_levels, run_level
from kvplan.load.progress import level_progress
from kvplan.load.prompts import sample_buckets
from kvplan.load.run_estimate import compute_estimate, plan_target
from kvplan.load.sim.search import resolve_auto, simulated_knees, with_knees
from kvplan.load.workload import Workload
from kvplan.results.run_result import RunData, RunResult, WorkloadRef, load_run, save_result
from kvplan.results.store import RunWriter, check_out, create_run_dir
from kvplan.results.summarize import summarize


class ReportInterrupted(KvplanError):
    """Ctrl-C while the summaries or the report were written: the records and results.json are on
    disk, the views may be missing; ``kvplan report DIR`` writes them. Exit code 130 (SIGINT)."""

    exit_code = 130

    def __init__(self, run_dir: Path):
        super().__init__("", "interrupted while writing the report; the records are saved",
                         f"run `kvplan report {run_dir}` to write it", source=str(run_dir))


def now_iso() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def start_run(workload: Workload, result: RunResult, run_dir: Path | None) -> Path:
    """Create the run folder with its results.json and a copy of the workload file. The folder
    appears only now, and with results.json at once: Ctrl-C before this leaves none."""
    run_dir = create_run_dir(workload.name, run_dir)
    save_result(run_dir, result)
    if workload.source != "<memory>" and Path(workload.source).is_file():
        (run_dir / "workload.yaml").write_bytes(Path(workload.source).read_bytes())
    return run_dir


def run_levels(backend: Backend, levels: Sequence[Level], run_dir: Path, kv_sizes: Callable, seed: int,
               console=None, hooks=None, flush: bool = True) -> str:
    """Every level on ``backend``, records appended to ``run_dir`` (each line flushed as written
    unless ``flush`` is False); returns the run's status: complete, or interrupted (Ctrl-C, or the
    backend stopped: ``RunStopped``; the records written so far stay). ``hooks``:
    ``level_started(level)`` / ``level_finished(level)`` around each level."""
    say = console.print if console is not None else (lambda *a, **k: None)
    with RunWriter(run_dir, flush) as writer:
        try:
            for level in levels:
                if hooks is not None:
                    hooks.level_started(level)
                with level_progress(console, level) as advance:
                    run_level(backend, level, Recorder(writer, level, kv_sizes, advance), seed)
                if hooks is not None:
                    hooks.level_finished(level)
        except KeyboardInterrupt:
            say("[yellow]interrupted: writing the report of the requests that finished[/yellow]")
            return "interrupted"
        except RunStopped as err:
            say(f"[red]stopped: {err}; writing the report of the requests that finished[/red]", markup=True)
            return "interrupted"
    return "complete"


def finish_run(run_dir: Path, result: RunResult, status: str, charts: bool = True) -> Path:
    """Summarize the records, save the final result and write the report (``charts``: its PNGs too).

    Raises:
        ReportInterrupted: Ctrl-C while doing so.
    """
    try:
        data = load_run(run_dir)
        result = summarize(result, data.requests, data.steps, data.server_samples)
        # report_written: render_report sets it once every view is written
        result = result.model_copy(update={"status": status, "finished_at": now_iso(), "report_written": False})
        save_result(run_dir, result)
        from kvplan.results.report.render import render_report

        render_report(run_dir, charts, RunData(run_dir, result, data.requests, data.steps, data.server_samples))
    except KeyboardInterrupt:
        raise ReportInterrupted(run_dir) from None
    return run_dir


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
    say(f"[dim]loading {workload.engine.model}...[/dim]")
    engine = engine or build_engine(workload)
    facts = engine_facts(engine)
    sampled = sample_buckets(workload, tokenizer_function(engine), facts.vocab_size)
    check_requests_fit(workload, facts, sampled.requests)
    workload = resolve_auto(workload, facts, sampled.requests)  # concurrency: auto -> levels around the knee
    if "num_conversations" in sampled.dataset_info:
        say(f"[dim]sharegpt: read {sampled.dataset_info['num_conversations']:,} whole conversations[/dim]")
    is_fp8 = facts.kv_cache_dtype == "fp8"
    if is_fp8:  # scales from a few of the run's own prompts, set before the first step
        from kvplan.load.fp8_check import calibrate_for_run

        facts = facts.model_copy(update={"kv_scales": calibrate_for_run(engine, workload, sampled.requests)})
    estimate, pricing = compute_estimate(workload, facts, sampled.requests)
    estimate = with_knees(estimate, simulated_knees(workload, facts, sampled.requests))
    result = RunResult(
        started_at=started, slo=workload.slo, engine=facts, estimate=estimate, run=run_info(sampled.dataset_info),
        workload=WorkloadRef(name=workload.name, source=workload.source, sha256=workload.sha256,
                             config=workload.model_dump(mode="json")),
    )
    run_dir = start_run(workload, result, run_dir)
    status = run_levels(EngineBackend(engine), plan_levels(workload, sampled.requests), run_dir,
                        pricing.step_bytes, workload.seed, console)
    if is_fp8 and status == "complete" and workload.fp8_quality.num_prompts:
        from kvplan.load.fp8_check import check_for_run

        say(f"[dim]fp8 quality check on {workload.fp8_quality.num_prompts} prompts...[/dim]")
        try:
            result = result.model_copy(update={"fp8_quality": check_for_run(engine, workload, sampled.requests)})
        except KeyboardInterrupt:  # every level is whole; the check is not
            status = "interrupted"
            say("[yellow]interrupted: no fp8 quality check; writing the report[/yellow]")
    return finish_run(run_dir, result, status)
