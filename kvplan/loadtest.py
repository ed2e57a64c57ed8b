"""The load driver: one engine, every bucket x level, every request and step recorded.

Order of a run (each stage saved before the next starts, so a crash keeps what came before)::

    load workload -> build engine -> sample prompts -> check every request fits (loadtest_checks)
      -> fp8 scales (calibration) -> estimate -> run folder with results.json (status running)
      -> for bucket, for level: submit + step, append requests.jsonl / steps.jsonl as they happen
      -> summaries (results.json, status complete | interrupted, report_written false)
      -> report (md, csv, png; then report_written true)

Closed loop (``concurrency: N``): N requests in flight; a finished one is replaced at once.
Open loop (``request_rates: r``): Poisson arrivals at r requests/s; each request's arrival_time
is its scheduled arrival, so queueing before admission counts in its TTFT.
Every level replays the bucket's same requests with its own cache salt, so levels differ only in
load and never hit each other's prefix-cache blocks. A ``shared_prefix`` workload runs each level
twice, variant ``cached`` (one salt per tenant: a group's requests share prefix blocks) then
``uncached`` (one salt per request: nothing shared), for TTFT with and without prefix reuse side
by side (kvplan.prefix_metrics). Ctrl-C stops at once and keeps a valid report of the requests
that finished (status interrupted; a level it cut short is marked partial); Ctrl-C while the
report is written raises ``ReportInterrupted``. The driver reads nothing of the engine beyond its
public properties, ``RequestOutput`` and ``StepStats``.
With an fp8 KV cache the engine's scales are calibrated on a few of the run's prompts before the
first step (recorded in the run metadata), and the fp8 quality check runs after the last level
(kvplan.fp8_quality; its numbers go into results.json and summary.md).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvplan.errors import KvplanError
from kvplan.loadtest_checks import check_out, check_requests_fit, create_run_dir
from kvplan.loadtest_estimate import KVPricing, compute_estimate, kv_dtype_name, plan_target
from kvplan.prefix_metrics import CACHED, UNCACHED, VARIANTS
from kvplan.prompts import SampledRequest, sample_buckets
from kvplan.results import RequestRecord, RunWriter, StepRecord, load_run, summarize_run, write_results
from kvplan.workload import Workload

# EngineConfig field -> the workload YAML's name for it, where they differ
_YAML_FIELDS = {"kv_cache_memory_bytes": "kv_cache_memory"}


class ReportInterrupted(KvplanError):
    """Ctrl-C while the summaries or the report were written: the records and results.json are on
    disk, the views may be missing; ``kvplan report DIR`` writes them. Exit code 130 (SIGINT)."""

    exit_code = 130

    def __init__(self, run_dir: Path):
        super().__init__(str(run_dir), "interrupted while writing the report; the records are saved",
                         f"run `kvplan report {run_dir}` to write it")


@dataclass(frozen=True)
class Level:
    """One load level of one bucket: ``level`` is N (closed) or requests/s (open); ``variant``
    is "" or, in a shared_prefix run, "cached" / "uncached" (kvplan.prefix_metrics)."""

    bucket: str
    bucket_index: int
    mode: str
    level: int | float  # int N (closed) or requests/s (open)
    requests: tuple[SampledRequest, ...]
    variant: str = ""

    @property
    def label(self) -> str:
        name = f"{self.bucket} c={int(self.level)}" if self.mode == "closed" else f"{self.bucket} {self.level:g} req/s"
        return f"{name} {self.variant}".rstrip()

    @property
    def key(self) -> str:
        return f"{self.bucket}/{self.mode}/{self.level:g}" + (f"/{self.variant}" if self.variant else "")

    def cache_salt(self, index: int, request: SampledRequest) -> str:
        """Unique per request in the uncached variant (nothing shared), one per tenant in the
        cached one, else the level's own (levels never hit each other's blocks)."""
        if self.variant == UNCACHED:
            return f"{self.key}/{index}"
        if self.variant == CACHED and request.tenant is not None:
            return f"{self.key}/tenant{request.tenant}"
        return self.key


def run_metadata(engine, cfg) -> dict:
    """What ran: versions, machine, the engine's resolved settings and KV pool (from its public
    properties), and the scheduler settings of ``cfg`` (the EngineConfig it was built from)."""
    import platform

    import torch
    import transformers

    import kvplan

    return {
        "kvplan_version": kvplan.__version__, "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "platform": platform.platform(), "model": engine.model_name, "device": str(engine.device),
        "dtype": str(engine.dtype).removeprefix("torch."), "kv_cache_dtype": kv_dtype_name(engine.kv_cache_dtype),
        "attention_backend": engine.attention_backend, "block_size": engine.block_size,
        "num_blocks": engine.num_blocks, "bytes_per_block": engine.bytes_per_block,
        "bytes_per_token": engine.bytes_per_block // engine.block_size,
        "pool_bytes": engine.num_blocks * engine.bytes_per_block,
        "pool_tokens": engine.num_blocks * engine.block_size, "max_model_len": engine.max_model_len,
        "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "enable_prefix_caching": cfg.enable_prefix_caching, "seed": cfg.seed,
    }


# ---- the run --------------------------------------------------------------------------------
def plan_levels(workload: Workload, sampled: dict[str, list[SampledRequest]]) -> list[Level]:
    """Bucket by bucket: closed-loop levels in ascending concurrency, then open-loop rates; in a
    shared_prefix workload each level twice in a row, cached then uncached (a slower first
    level, while the process warms up, then counts against caching)."""
    variants = VARIANTS if workload.shared_prefix is not None else ("",)
    levels = []
    for i, bucket in enumerate(workload.buckets):
        reqs = tuple(sampled[bucket.name])
        for mode, values in (("closed", bucket.concurrency), ("open", bucket.request_rates)):
            levels += [Level(bucket.name, i, mode, x if mode == "closed" else float(x), reqs, v)
                       for x in sorted(values) for v in variants]
    return levels


def build_engine(workload: Workload):
    """The engine the workload describes; its errors become one line naming the field."""
    from engine.llm_engine import LLMEngine

    try:
        return LLMEngine(workload.engine.to_engine_config(workload.seed))
    except (ValueError, RuntimeError) as err:  # EngineConfig, ModelLoadError: "<field>: <problem>"
        message = str(err).splitlines()[0] if str(err) else ""
        field, _, problem = message.partition(": ")
        if problem and field.isidentifier():
            name = _YAML_FIELDS.get(field, field)  # the engine's text may name its own field again
            raise KvplanError(f"{workload.source}: engine.{name}", problem.replace(field, name)) from None
        if isinstance(err, RuntimeError):  # not a settings problem: keep the traceback
            raise
        raise KvplanError(f"{workload.source}: engine.model", message) from None


class _Recorder:
    """Turns engine outputs into records, writes them, and counts progress for one level."""

    def __init__(self, writer: RunWriter, pricing: KVPricing, level: Level, advance: Callable[[], None]):
        self.writer, self.pricing, self.level, self.advance = writer, pricing, level, advance
        self.submitted: dict[str, tuple[SampledRequest, str]] = {}  # request id -> (request, cache salt)

    def step(self, engine) -> int:
        outputs, stats = engine.step()
        ideal, paged, contiguous, measured = self.pricing.step_bytes(stats)
        lv = self.level
        self.writer.write_step(StepRecord(
            stats.step_index, lv.bucket, lv.mode, lv.level, stats.start_time, stats.end_time,
            stats.num_prefill_tokens, stats.num_decode_tokens, stats.num_running, stats.num_waiting,
            stats.num_used_blocks, stats.num_free_blocks, stats.num_total_blocks,
            stats.num_preemptions, stats.num_finished, stats.num_oom,
            stats.num_prefix_queried_tokens, stats.num_prefix_hit_tokens,
            tuple(stats.kv_resident_tokens), ideal, paged, contiguous, measured, variant=lv.variant,
            kv_resident_request_ids=tuple(stats.kv_resident_request_ids),
        ))
        for out in outputs:
            req, salt = self.submitted.pop(out.request_id)
            self.writer.write_request(RequestRecord(
                out.request_id, lv.bucket, lv.mode, lv.level, out.arrival_time, out.first_scheduled_time,
                out.finish_time, tuple(out.token_times), len(out.prompt_token_ids), len(out.output_token_ids),
                req.max_tokens, out.finish_reason, out.finish_detail,
                out.num_preemptions, out.num_cached_tokens,
                variant=lv.variant, prefix_group=req.prefix_group, tenant=req.tenant, cache_salt=salt,
            ))
            self.advance()
        return len(outputs)


def run_level(engine, level: Level, recorder: _Recorder, seed: int) -> None:
    """Drive one level to the end: closed loop keeps ``level`` requests in flight; open loop
    submits at Poisson arrival times (exponential gaps of mean 1/rate s, seeded per level)."""
    from engine.request import SamplingParams

    pending = list(enumerate(level.requests))
    in_flight = 0
    if level.mode == "open":
        # min: a rate near float's top would make the seed word inf (rates are finite, > 0)
        rng = np.random.default_rng([seed, level.bucket_index, int(min(level.level * 1000, 2**63))])
        gaps = rng.exponential(1.0 / level.level, size=len(pending))
        offsets = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    t0 = time.perf_counter()

    def submit(index: int, req: SampledRequest, arrival: float | None) -> None:
        rid, salt = f"{level.key}/{index}", level.cache_salt(index, req)
        recorder.submitted[rid] = (req, salt)
        params = SamplingParams(max_tokens=req.max_tokens, ignore_eos=True, seed=seed + index)
        engine.add_request(list(req.prompt_token_ids), params, request_id=rid, arrival_time=arrival, cache_salt=salt)

    while pending or in_flight:
        if level.mode == "closed":
            while pending and in_flight < level.level:
                submit(*pending.pop(0), None)
                in_flight += 1
        else:
            now = time.perf_counter()
            while pending and t0 + offsets[pending[0][0]] <= now:
                index, req = pending.pop(0)
                submit(index, req, t0 + offsets[index])
                in_flight += 1
            if not in_flight:  # idle until the next scheduled arrival
                time.sleep(max(0.0, t0 + offsets[pending[0][0]] - time.perf_counter()))
                continue
        in_flight -= recorder.step(engine)


def run_loadtest(
    workload: Workload, run_dir: Path | None = None, *, engine=None, console=None,
) -> Path:
    """Run ``workload`` and write its report folder; returns the folder. results.json's status
    says how it ended: complete, or interrupted (Ctrl-C during the levels or the fp8 check).

    engine: an already built engine to reuse (tests); by default one is built from
        ``workload.engine``. console: a rich Console for progress bars and notes (None: silent).

    Raises:
        KvplanError: an ``--out`` that cannot be a new run folder, engine settings the engine
            refuses, a model that cannot load, prompts that cannot fill a bucket, a sampled
            request the engine could never run, a plan target kvplan does not know; all before
            the run folder exists.
        ReportInterrupted: Ctrl-C after the levels, while the summaries or report were written.
    """
    say = console.print if console is not None else (lambda *a, **k: None)
    started = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    for index in range(len(workload.plan)):  # a bad plan target fails before the model loads
        plan_target(workload, index, {})
    check_out(run_dir)
    say(f"[dim]loading {workload.engine.model}...[/dim]")
    engine = engine or build_engine(workload)
    tokenize = None if engine.tokenizer is None else (lambda texts: engine.tokenizer(texts)["input_ids"])
    sampled = sample_buckets(workload, tokenize, engine.hf_config.vocab_size)
    check_requests_fit(workload, engine, sampled.requests)
    if "num_conversations" in sampled.dataset_info:
        say(f"[dim]sharegpt: read {sampled.dataset_info['num_conversations']:,} whole conversations[/dim]")
    results = {
        "status": "running", "started_at": started, "finished_at": None,
        "workload": {"name": workload.name, "source": workload.source, "sha256": workload.sha256,
                     "config": workload.model_dump(mode="json")},
        "run": {**run_metadata(engine, workload.engine.to_engine_config(workload.seed)),
                "dataset": sampled.dataset_info},
    }
    is_fp8 = kv_dtype_name(engine.kv_cache_dtype) == "fp8"
    if is_fp8:  # scales from a few of the run's own prompts, set before the first step
        from kvplan.fp8_quality import calibrate_for_run

        results["run"]["kv_scales"] = calibrate_for_run(engine, workload, sampled.requests)
    results["estimate"], pricing = compute_estimate(workload, engine, sampled.requests)
    # The folder appears only now, and with results.json at once: Ctrl-C before this leaves none.
    run_dir = create_run_dir(workload, run_dir)
    write_results(run_dir, results)
    if workload.source != "<memory>" and Path(workload.source).is_file():
        (run_dir / "workload.yaml").write_bytes(Path(workload.source).read_bytes())

    status = "complete"
    with RunWriter(run_dir) as writer:
        try:
            for level in plan_levels(workload, sampled.requests):
                _run_with_progress(engine, level, writer, pricing, workload.seed, console)
        except KeyboardInterrupt:
            status = "interrupted"
            say("[yellow]interrupted: writing the report of the requests that finished[/yellow]")
    try:
        if is_fp8 and status == "complete" and workload.fp8_quality.num_prompts:
            from kvplan.fp8_quality import check_for_run

            say(f"[dim]fp8 quality check on {workload.fp8_quality.num_prompts} prompts...[/dim]")
            try:
                results["fp8_quality"] = check_for_run(engine, workload, sampled.requests)
            except KeyboardInterrupt:  # every level is whole; the check is not
                status = "interrupted"
                say("[yellow]interrupted: no fp8 quality check; writing the report[/yellow]")
        data = load_run(run_dir)
        results.update(summarize_run(results, data.requests, data.steps))
        results.update(status=status, finished_at=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                       report_written=False)  # render_report sets it once every view is written
        write_results(run_dir, results)
        from kvplan.report import render_report

        render_report(run_dir)
    except KeyboardInterrupt:
        raise ReportInterrupted(run_dir) from None
    return run_dir


def _run_with_progress(engine, level: Level, writer: RunWriter, pricing: KVPricing, seed: int, console) -> None:
    if console is None:
        run_level(engine, level, _Recorder(writer, pricing, level, lambda: None), seed)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"{level.label:<24}", total=len(level.requests))
        run_level(engine, level, _Recorder(writer, pricing, level, lambda: progress.advance(task)), seed)
