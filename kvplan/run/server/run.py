"""``kvplan loadtest WORKLOAD --target URL``: the workload's buckets and levels against a running
OpenAI-compatible server, every stage saved before the next starts (as ``kvplan.run.loadtest``)::

    workload -> pre-flight (models, key, metrics: kvplan.run.server.preflight) -> tokenizer
      -> sampled requests -> every request fits the server's max_model_len?
      -> kvplan's estimate beside the server's KV pool -> run folder (source target)
      -> per level: /metrics scraper + HttpBackend under the same driver; client lag per level
      -> summaries (server preemptions and KV usage per level) -> report

Bad input (unreachable URL, a non-OpenAI server, a refused key, a model not served) stops before
the run folder exists. A server that stops answering mid-run ends the run there: the report keeps
what finished (status interrupted, ``stop_reason`` set). Imports no torch.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np

from kvplan.errors import KvplanError
from kvplan.results.run_result import ClientLevel, RecordFiles, RunInfo, RunResult, ServerInfo, WorkloadRef
from kvplan.results.stats.server_samples import SERVER_METRICS_FILE
from kvplan.results.store import check_out
from kvplan.run.driver import Level, schedule_levels
from kvplan.run.estimate import plan_target
from kvplan.run.lifecycle import finish_run, now_iso, run_levels, start_run
from kvplan.run.server.backend import SALT_KINDS, BodySpec, HttpBackend
from kvplan.run.server.client import LAG_TICK_S
from kvplan.run.server.client_lag import judge, p99_ms, stamp_delay_quantile
from kvplan.run.server.estimate import kv_usage_note, target_estimate
from kvplan.run.server.preflight import EXACT_LENGTH_KINDS, TOKEN_ID_KINDS, run_preflight
from kvplan.run.server.scraper import Scraper
from kvplan.run.server.server_metrics import pool_numbers
from kvplan.run.server.tokenizer import load_target_tokenizer, random_vocab
from kvplan.traffic.prompts import sample_buckets
from kvplan.workload.schema import Workload
from kvplan.workload.trace import check_replay

STREAMS_PER_WORKER = 250


def num_workers(workload: Workload) -> int:
    """``target.workers``, or for ``auto`` one client process per 250 streams of the widest
    closed-loop level (at most the CPU count; 1 in this process below that)."""
    assert workload.target is not None  # a target run's workload
    setting = workload.target.workers
    if setting != "auto":
        return setting
    widest = max((c for b in workload.buckets for c in b.concurrency), default=1)
    return max(1, min(os.cpu_count() or 1, -(-widest // STREAMS_PER_WORKER)))


class _Hooks:
    """Around each level: the scraper's boundary reads and the client's lag and CPU."""

    def __init__(self, backend: HttpBackend, scraper: Scraper | None):
        self.backend, self.scraper = backend, scraper
        self.client: list[ClientLevel] = []
        self._start = 0.0

    def level_started(self, level: Level) -> None:
        self.backend.client_stats()  # reset the counters
        self.backend.level_ttfts_s, self.backend.level_send_delays_s = [], []
        if self.scraper is not None:
            self.scraper.start_level(level.key)
        self._start = self.backend.now()

    def level_finished(self, level: Level) -> None:
        wall = self.backend.now() - self._start
        if self.scraper is not None:
            self.scraper.end_level()
        lags, cpu = self.backend.client_stats()
        lag = np.asarray(lags) * 1e3
        key, backend = level.key, self.backend
        ttfts = backend.level_ttfts_s
        stamp = stamp_delay_quantile(lags, LAG_TICK_S)
        ttft_p50 = float(np.percentile(np.asarray(ttfts) * 1e3, 50)) if ttfts else None
        is_open = key.mode == "open"
        sends = p99_ms(backend.level_send_delays_s) if is_open else None
        gap = 1e3 / level.value if is_open and level.value > 0 else None
        reason = judge(None if stamp is None else stamp * 1e3, ttft_p50, sends, gap)
        self.client.append(
            ClientLevel(
                bucket=key.bucket,
                mode=key.mode,
                level=key.value,
                variant=key.variant,
                workers=backend.num_workers,
                lag_p99_ms=float(np.percentile(lag, 99)) if lag.size else None,
                lag_max_ms=float(lag.max()) if lag.size else None,
                cpu_s=cpu,
                wall_s=wall,
                behind=bool(reason),
                stamp_delay_p99_ms=None if stamp is None else stamp * 1e3,
                ttft_p50_ms=ttft_p50,
                send_delay_p99_ms=sends,
                mean_interarrival_ms=gap,
                behind_reason=reason,
            )
        )
        backend.level_ttfts_s, backend.level_send_delays_s = [], []


def _check_lengths(workload: Workload, max_model_len: int | None, sampled) -> None:
    if max_model_len is None:
        return
    for i, bucket in enumerate(workload.buckets):
        longest = max((r.num_tokens for r in sampled.get(bucket.name, [])), default=0)
        if longest > max_model_len:
            raise KvplanError(
                f"buckets[{i}]",
                f"the longest request ({longest} tokens) exceeds the server's max_model_len {max_model_len}",
                "lower its input_tokens or output_tokens",
                source=workload.source,
            )


def run_target_loadtest(
    workload: Workload, run_dir: Path | None = None, *, url_field: str = "target.url", console=None
) -> Path:
    """Run ``workload`` against ``workload.target`` and write its report folder; returns it.

    url_field: how errors name the URL (``target`` when it came from ``--target``).

    Raises:
        KvplanError: before the run folder exists (see the module docstring), or ReportInterrupted.
    """
    say = console.print if console is not None else (lambda *a, **k: None)
    if any(v is not None for v in workload.engine.admission.model_dump().values()):
        say(
            "note: engine.admission is the bundled engine's and simulate's; a server's own flags decide its"
            " admission (engine.serve: --max-num-waiting, --kv-admission-reserve, ...)",
            markup=False,
            highlight=False,
        )
    target, started = workload.target, now_iso()
    assert target is not None and target.url is not None  # a target run's workload (with_target checks the url)
    for index in range(len(workload.plan)):
        plan_target(workload, index, {})
    check_out(run_dir)
    check_replay(workload)  # a trace replayed whole: at most a level's 24 h
    source = workload.source if url_field != "target" else None
    pre = run_preflight(target, url_field, source)
    tokenizer = load_target_tokenizer(workload)
    vocab, vocab_source = random_vocab(workload, tokenizer)
    sampled = sample_buckets(workload, tokenizer.encode_batch if tokenizer else None, vocab)
    _check_lengths(workload, pre.max_model_len, sampled.requests)
    pool = pool_numbers(pre.metrics.pool) if pre.metrics else (None, None, None, None)
    llama = pre.llama
    if llama is not None and not any(pool[:3]):  # llama.cpp: its pool from /props, not /metrics
        pool = (None, None, llama.pool_tokens, pool[3])
    slots = (llama.num_slots, llama.slot_ctx_tokens) if llama is not None else None
    estimate, note = target_estimate(workload, pool, sampled.requests, slots)
    p95 = {b.name: b.p95_request_tokens for b in estimate.buckets} if estimate else {}
    if estimate is not None and workload.plan:
        estimate = estimate.model_copy(
            update={"plan": [plan_target(workload, i, p95) for i in range(len(workload.plan))]}
        )
    exact = target.exact_lengths if target.exact_lengths != "auto" else pre.kind in EXACT_LENGTH_KINDS
    as_text = (
        target.prompt_format == "text"
        or target.api == "chat"
        or (target.prompt_format == "auto" and tokenizer is not None and pre.kind not in TOKEN_ID_KINDS)
    )
    if as_text and tokenizer is None:
        raise KvplanError(
            "target.tokenizer", "is needed to send text prompts", "give target.tokenizer", source=workload.source
        )
    say(
        f"[dim]target {target.url}: model {pre.model} ({pre.kind or 'unknown server'}), metrics"
        f" {'read every ' + str(target.scrape_interval_ms) + ' ms' if pre.metrics else 'unavailable'}[/dim]"
    )
    say(f"[dim]{note}[/dim]", markup=True, highlight=False)
    say(f"[dim]random token ids from [0, {vocab:,}): {vocab_source}[/dim]", markup=True, highlight=False)
    blocks, block_size, tokens, cache_dtype = pool
    usage_name = pre.metrics.names.get("kv_usage") if pre.metrics else None
    pool_source = (
        llama.source
        if llama is not None and tokens == llama.pool_tokens and not blocks
        else (pre.metrics.pool.get("source") if pre.metrics and tokens else None)
    )
    server = ServerInfo(
        url=target.url,
        model=pre.model,
        api=target.api,
        kind=pre.kind,
        metrics_available=pre.metrics is not None,
        metrics_seen=list(pre.metrics.seen) if pre.metrics else [],
        num_gpu_blocks=blocks,
        block_size=block_size,
        pool_tokens=tokens,
        cache_dtype=cache_dtype,
        exact_lengths=exact,
        prompt_format="text" if as_text else "token_ids",
        scrape_interval_ms=target.scrape_interval_ms if pre.metrics else None,
        pool_note=note,
        pool_source=pool_source,
        num_slots=llama.num_slots if llama else None,
        slot_ctx_tokens=llama.slot_ctx_tokens if llama else None,
        kv_usage_metric=usage_name,
        kv_usage_note=kv_usage_note(workload, usage_name, pre.metrics.seen if pre.metrics else ()),
        vocab_size=vocab if workload.dataset.kind == "random" else None,
        vocab_source=vocab_source if workload.dataset.kind == "random" else None,
    )
    import kvplan

    result = RunResult(
        source="target",
        started_at=started,
        slo=workload.slo,
        level_plans=workload.level_plans,
        class_slos=workload.class_slos,
        engine=None,
        server=server,
        estimate=estimate,
        run=RunInfo(
            kvplan_version=kvplan.__version__,
            python=platform.python_version(),
            platform=platform.platform(),
            dataset=sampled.dataset_info,
        ),
        workload=WorkloadRef(
            name=workload.name, source=workload.source, sha256=workload.sha256, config=workload.model_dump(mode="json")
        ),
        records=RecordFiles(server_metrics=SERVER_METRICS_FILE if pre.metrics else None),
    )
    run_dir = start_run(workload, result, run_dir)
    spec = BodySpec(
        target.url,
        target.api,
        pre.model,
        exact,
        pre.kind in SALT_KINDS,
        dict(target.extra_body),
        tokenizer.decode if as_text and tokenizer is not None else None,  # as_text: a tokenizer (checked above)
    )
    headers = {"Authorization": f"Bearer {pre.api_key}"} if pre.api_key else {}
    backend = HttpBackend(
        spec, headers, target.timeout_s, num_workers(workload), tokenizer.count if tokenizer else None
    )
    scraper = (
        Scraper(target.scrape_url, pre.api_key, target.scrape_interval_ms / 1e3, run_dir / SERVER_METRICS_FILE)
        if pre.metrics
        else None
    )
    hooks = _Hooks(backend, scraper)
    try:
        status = run_levels(
            backend,
            schedule_levels(workload, sampled.requests),
            run_dir,
            lambda stats: {},
            workload.seed,
            console,
            hooks,
        )
    finally:
        backend.close()
        if scraper is not None:
            scraper.close()
    result = result.model_copy(update={"client": hooks.client, "stop_reason": backend.stopped_because})
    return finish_run(run_dir, result, status)
