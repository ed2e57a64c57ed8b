"""``/metrics`` of ``python -m engine.serve``: the engine's state under vLLM's metric names.

Names, kinds and meanings follow vLLM's v1 production metrics (docs.vllm.ai, "Production
Metrics"; vllm/v1/metrics/loggers.py), so a scraper written for vLLM reads this server unchanged::

    vllm:cache_config_info{block_size, num_gpu_blocks, cache_dtype, enable_prefix_caching}  1
    vllm:num_requests_running      gauge    requests in the running batch
    vllm:num_requests_waiting      gauge    requests queued (new or preempted)
    vllm:kv_cache_usage_perc       gauge    used blocks / total blocks, 0..1 (1 = full)
    vllm:num_preemptions_total     counter  preemptions (recompute)
    vllm:prefix_cache_queries_total counter prompt tokens looked up in the prefix cache
    vllm:prefix_cache_hits_total   counter  of those, found cached
    vllm:prompt_tokens_total       counter  prefill tokens computed
    vllm:generation_tokens_total   counter  decode tokens computed
    vllm:request_success_total{finished_reason}  counter  finished requests by reason
    kvplan_engine_requests_rejected_total{reason}  counter  requests admission refused (HTTP 429),
                                   by reason: queue_full, tenant_waiting, kv_budget (engine.admission);
                                   the engine's own, so named apart from vLLM's
    kvplan_engine_offload_stores_total{tier}  counter  KV blocks stored into a lower tier (host, disk)
    kvplan_engine_offload_loads_total{tier}   counter  KV blocks loaded back to the device from one
    kvplan_engine_offload_hit_tokens_total{tier} counter prefix-hit tokens served by a lower tier
    kvplan_engine_offload_bytes_total{direction}  counter  bytes moved: stored (down), loaded (up)
    kvplan_engine_offload_blocks{tier}     gauge    blocks a lower tier holds
                                   (engine.offload; present only when the engine has a lower tier)
Every gauge is set after every engine step, from that step's ``StepStats``. One registry per
server (never the process-global one), so several servers in one test process do not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, disable_created_metrics, generate_latest

from engine.admission import REASONS


class ServeMetrics:
    """The registry and its metrics, labelled ``model_name`` as vLLM labels them. ``offload_tiers``:
    the engine's lower tiers (``host``, ``disk``; engine.offload), each exported by tier."""

    def __init__(
        self,
        model_name: str,
        *,
        block_size: int,
        num_gpu_blocks: int,
        cache_dtype: str,
        enable_prefix_caching: bool,
        offload_tiers: tuple[str, ...] = (),
    ):
        disable_created_metrics()  # no *_created series (vLLM's exposition has none either)
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        Info("vllm:cache_config", "Information of the LLMEngine CacheConfig", registry=r).info(
            {
                "block_size": str(block_size),
                "num_gpu_blocks": str(num_gpu_blocks),
                "cache_dtype": cache_dtype,
                "enable_prefix_caching": str(enable_prefix_caching),
            }
        )
        gauge = lambda name, doc: Gauge(name, doc, labels, registry=r).labels(model_name)  # noqa: E731
        count = lambda name, doc: Counter(name, doc, labels, registry=r).labels(model_name)  # noqa: E731
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = count("vllm:num_preemptions", "Cumulative number of preemptions from the engine.")
        self.prefix_queries = count("vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens.")
        self.prefix_hits = count("vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.")
        self.prompt_tokens = count("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = count("vllm:generation_tokens", "Number of generation tokens processed.")
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self._rejected = Counter(
            "kvplan_engine_requests_rejected",
            "Requests refused at the entry by admission (answered 429), by reason.",
            ["model_name", "reason"],
            registry=r,
        )
        for reason in REASONS:  # every reason shows, at 0 until one happens
            self._rejected.labels(model_name, reason)
        self._model = model_name
        self._offload = offload_tiers
        if offload_tiers:
            labelled = ["model_name", "tier"]
            stores = Counter(
                "kvplan_engine_offload_stores", "KV blocks stored into a lower tier.", labelled, registry=r
            )
            loads = Counter(
                "kvplan_engine_offload_loads", "KV blocks loaded back from a lower tier.", labelled, registry=r
            )
            hits = Counter(
                "kvplan_engine_offload_hit_tokens", "Prefix-hit tokens served by a lower tier.", labelled, registry=r
            )
            blocks = Gauge("kvplan_engine_offload_blocks", "KV blocks a lower tier holds.", labelled, registry=r)
            moved = Counter(
                "kvplan_engine_offload_bytes",
                "Bytes moved between tiers, by direction.",
                ["model_name", "direction"],
                registry=r,
            )
            self._tier_metrics = {
                t: (
                    stores.labels(model_name, t),
                    loads.labels(model_name, t),
                    hits.labels(model_name, t),
                    blocks.labels(model_name, t),
                )
                for t in offload_tiers
            }
            self._moved = {d: moved.labels(model_name, d) for d in ("stored", "loaded")}

    def observe_step(self, stats, outputs, num_generated: int | None = None) -> None:
        """After one step: gauges from ``stats`` (engine.outputs.StepStats), counters advanced.
        ``num_generated``: the tokens the step generated, a request's first included, as vLLM v1
        counts ``generation_tokens`` (vllm/v1/metrics/stats.py, IterationStats.update_from_output:
        every new token id); None: the step's decode tokens (its first tokens left out)."""
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.num_used_blocks / stats.num_total_blocks if stats.num_total_blocks else 0.0)
        self.preemptions.inc(stats.num_preemptions)
        self.prefix_queries.inc(stats.num_prefix_queried_tokens)
        self.prefix_hits.inc(stats.num_prefix_hit_tokens)
        self.prompt_tokens.inc(stats.num_prefill_tokens)
        self.generation_tokens.inc(stats.num_decode_tokens if num_generated is None else num_generated)
        if self._offload:
            for tier, (stores, loads, hits, blocks) in self._tier_metrics.items():
                stores.inc(getattr(stats, f"num_{tier}_stores"))
                loads.inc(getattr(stats, f"num_{tier}_loads"))
                hits.inc(getattr(stats, f"num_{tier}_hit_tokens"))
                blocks.set(getattr(stats, f"num_{tier}_blocks"))
            self._moved["stored"].inc(stats.offload_bytes_stored)
            self._moved["loaded"].inc(stats.offload_bytes_loaded)
        for out in outputs:
            if out.finish_reason in ("stop", "length"):
                self._success.labels(self._model, out.finish_reason).inc()

    def observe_rejected(self, reason: str) -> None:
        """One request refused at the entry for ``reason`` (engine.admission.REASONS)."""
        self._rejected.labels(self._model, reason).inc()

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
