"""The run folder's life cycle, the stages every kind of run shares (bundled engine, remote
target, simulation)::

    start_run: run folder + results.json (status running) + a copy of the workload file
    run_levels: every level on a Backend, records appended as they happen
    finish_run: summaries -> results.json (complete | interrupted) -> report

Ctrl-C during the levels stops at once and keeps a valid report of the requests that finished
(status interrupted; a level it cut short is marked partial); Ctrl-C while the report is written
raises ``ReportInterrupted``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.results.run_result import RunData, RunResult, load_run, save_result
from kvplan.results.stats.prefix_metrics import VARIANTS as PREFIX_VARIANTS
from kvplan.results.stats.variants import mixed_variant
from kvplan.results.store import KeptRecords, create_run_dir
from kvplan.results.summarize import summarize
from kvplan.results.writing.run_writer import RunWriter
from kvplan.run.driver import Backend, Level, Recorder, RunStopped, run_level
from kvplan.run.progress import level_progress
from kvplan.workload.schema import Workload


class ReportInterrupted(KvplanError):
    """Ctrl-C while the summaries or the report were written: the records and results.json are on
    disk, the views may be missing; ``kvplan report DIR`` writes them. Exit code 130 (SIGINT)."""

    exit_code = 130

    def __init__(self, run_dir: Path):
        super().__init__(
            "",
            "interrupted while writing the report; the records are saved",
            f"run `kvplan report {run_dir}` to write it",
            source=str(run_dir),
        )


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


def run_levels(
    backend: Backend,
    levels: Sequence[Level],
    run_dir: Path,
    kv_sizes: Callable,
    seed: int,
    console=None,
    hooks=None,
    flush: bool = True,
    variant_backend: Callable[[str], tuple[Backend, Callable]] | None = None,
    kept: KeptRecords | None = None,
) -> str:
    """Every level on ``backend``, records appended to ``run_dir`` (each line flushed as written
    unless ``flush`` is False); returns the run's status: complete, or interrupted (Ctrl-C, or the
    backend stopped: ``RunStopped``; the records written so far stay). ``hooks``:
    ``level_started(level)`` / ``level_finished(level)`` around each level. ``variant_backend``:
    an engine variant's name -> its backend and KV sizes (kvplan.workload.variants), for the levels
    run on one; the others run on ``backend``. ``kept``: where the records are kept in memory too
    (a simulation's, for ``finish_run``)."""
    say = console.print if console is not None else (lambda *a, **k: None)
    last: Backend = backend
    with RunWriter(run_dir, flush, kept) as writer:
        try:
            for level in levels:
                if hooks is not None:
                    hooks.level_started(level)
                on, sizes = backend, kv_sizes
                engine_variant = mixed_variant(level.key.variant)
                if variant_backend is not None and engine_variant not in ("", *PREFIX_VARIANTS):
                    on, sizes = variant_backend(engine_variant)
                if on is not last:  # one timeline: a simulated variant's clock starts where the run is
                    on.wait_until(last.now())
                    last = on
                with level_progress(console, level) as advance:
                    run_level(on, level, Recorder(writer, level, sizes, advance), seed)
                if hooks is not None:
                    hooks.level_finished(level)
        except KeyboardInterrupt:
            say("[yellow]interrupted: writing the report of the requests that finished[/yellow]")
            return "interrupted"
        except RunStopped as err:
            say(f"[red]stopped: {err}; writing the report of the requests that finished[/red]", markup=True)
            return "interrupted"
    return "complete"


def finish_run(
    run_dir: Path, result: RunResult, status: str, charts: bool = True, kept: KeptRecords | None = None
) -> Path:
    """Summarize the records, save the final result and write the report (``charts``: its PNGs too).
    ``kept``: the run's records as ``run_levels`` kept them (a run without server samples), instead
    of reading its JSONL files back (the same records: kvplan.results.store.KeptRecords).

    Raises:
        ReportInterrupted: Ctrl-C while doing so.
    """
    # a simulation's steps.csv (a million rows): made while it ran (kept.steps_csv, put in place by
    # the report; else the report writes it here), its last lines perhaps still being written
    # (kept.writing: waited for once the summaries are made, whatever happens)
    try:
        data = load_run(run_dir) if kept is None else RunData(run_dir, result, kept.requests, kept.steps, [])
        result = summarize(result, data.requests, data.steps, data.server_samples)
        # report_written: render_report sets it once every view is written
        result = result.model_copy(update={"status": status, "finished_at": now_iso(), "report_written": False})
        save_result(run_dir, result)
        from kvplan.results.report.render import render_report

        made = None
        if kept is not None:
            kept.written()
            made = kept.steps_csv
        data = RunData(run_dir, result, data.requests, data.steps, data.server_samples)
        render_report(run_dir, charts, data, steps_csv=made.finish if made is not None else None)
    except KeyboardInterrupt:
        raise ReportInterrupted(run_dir) from None
    finally:
        if kept is not None:
            kept.written()  # already, unless something above failed
            if kept.steps_csv is not None:
                kept.steps_csv.discard()  # put in place already, unless something above failed
    return run_dir
