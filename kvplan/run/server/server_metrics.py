"""A serving engine's ``/metrics`` (Prometheus text) -> the few values kvplan reads.

Names looked up in the servers' own docs and sources:

- vLLM (v1 engine; docs.vllm.ai "Production Metrics", vllm/v1/metrics/loggers.py):
  ``vllm:kv_cache_usage_perc`` (0..1; ``vllm:gpu_cache_usage_perc`` before v1),
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:num_preemptions_total``,
  ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (tokens; before v1
  ``vllm:gpu_prefix_cache_queries_total`` / ``_hits_total``), and ``vllm:cache_config_info`` whose
  labels carry ``num_gpu_blocks``, ``block_size`` and ``cache_dtype``. python -m engine.serve
  exposes the same names.
- SGLang (``--enable-metrics``; docs.sglang.io "Production Metrics",
  sglang/srt/observability/metrics_collector.py, formerly sglang/srt/metrics/collector.py,
  SchedulerMetricsCollector): ``sglang:full_token_usage`` (0..1, the full-attention KV pool; newer
  versions) else ``sglang:token_usage``, which is the highest usage over the KV, sliding-window
  and Mamba state pools (its FIXME says so; sgl-project/sglang#5979), so on a hybrid model it is
  not KV usage and the report names it for what it is; ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:num_retracted_requests_total`` (its preemptions,
  "retractions"; newer versions), ``sglang:cached_tokens_total`` (prefix-cache hit tokens) over
  ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``; the pool from
  ``sglang:cache_config_info`` (labels ``page_size``, ``num_pages``; sgl-project/sglang PR #17273,
  January 2026) where present, else ``sglang:max_total_num_tokens`` (tokens) with
  ``sglang:page_size``.
- llama.cpp's ``llama-server --metrics`` (ggml-org/llama.cpp tools/server/README.md "GET
  /metrics", tools/server/server-context.cpp, formerly server.cpp): ``llamacpp:requests_processing``,
  ``llamacpp:requests_deferred`` (waiting for a free slot), the counters
  ``llamacpp:prompt_tokens_total`` and ``llamacpp:tokens_predicted_total``; in newer builds
  ``llamacpp:prompt_tokens_cached_total`` (prompt tokens reused from a slot's cache; there
  ``prompt_tokens_total`` excludes them, tools/server/server-task.cpp
  ``server_task_result_metrics::to_metrics``), so prefix hits = cached and queries = processed +
  cached; and, in builds
  before ggml-org/llama.cpp PR #13660 (May 2025, which removed them as internal),
  ``llamacpp:kv_cache_usage_ratio`` (0..1) and ``llamacpp:kv_cache_tokens``. Newer builds expose
  no KV usage (``llamacpp:n_tokens_max``, the largest prompt seen, is not one), so it is
  unavailable there. Its pool is not in /metrics: kvplan.run.server.preflight reads /props.

A name the server does not expose leaves its field None (unavailable), never 0. Several label
sets of one name (data-parallel engines, several models) are summed, except usage, whose highest
value is kept. Only lines of these names are parsed, so a large exposition costs little.
"""

from __future__ import annotations

from dataclasses import dataclass

# field -> names in order of preference (the first one present wins)
FIELDS = {
    "kv_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:full_token_usage",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
    ),
    "num_running": ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing"),
    "num_waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"),
    "preemptions_total": ("vllm:num_preemptions_total", "sglang:num_retracted_requests_total"),
    "prefix_queries_total": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
        "sglang:prompt_tokens_total",
    ),
    "prefix_hits_total": (
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits_total",
        "sglang:cached_tokens_total",
    ),
    "kv_tokens": ("llamacpp:kv_cache_tokens",),
    "prompt_tokens_total": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total", "llamacpp:prompt_tokens_total"),
    "generation_tokens_total": (
        "vllm:generation_tokens_total",
        "sglang:generation_tokens_total",
        "llamacpp:tokens_predicted_total",
    ),
}
POOL_NAMES = (
    "vllm:cache_config_info",
    "sglang:cache_config_info",
    "sglang:max_total_num_tokens",
    "sglang:page_size",
)
LLAMA_CACHED = "llamacpp:prompt_tokens_cached_total"  # newer llama-server builds: prefix-cache hits
# SGLang pools besides full attention: seen on a hybrid (sliding-window or Mamba) server
SGLANG_HYBRID_NAMES = ("sglang:swa_token_usage", "sglang:mamba_usage")
KNOWN = frozenset(n for names in FIELDS.values() for n in names) | {*POOL_NAMES, *SGLANG_HYBRID_NAMES, LLAMA_CACHED}


@dataclass(frozen=True)
class MetricsRead:
    """One read: ``values`` per FIELDS key (None: not exposed); ``seen`` the known names present."""

    values: dict[str, float | None]
    seen: tuple[str, ...]
    pool: dict[str, str]  # num_gpu_blocks, block_size, pool_tokens, cache_dtype, source (as text)
    names: dict[str, str]  # FIELDS key -> the name its value was read from (only those present)


def _sample_lines(text: str) -> str:
    """Only the sample lines of known names (HELP/TYPE lines dropped: the parser needs none)."""
    keep = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in KNOWN:
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse_metrics(text: str) -> MetricsRead:
    """The known values of one ``/metrics`` body (see the module docstring).

    Raises:
        ValueError: the text is not Prometheus' text format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(_sample_lines(text)):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    values: dict[str, float | None] = {}
    names: dict[str, str] = {}
    for field, candidates in FIELDS.items():
        name = next((n for n in candidates if n in samples), None)
        if name is None:
            values[field] = None
            continue
        names[field] = name
        if field == "kv_usage":
            values[field] = max(s.value for s in samples[name])
        else:
            values[field] = sum(s.value for s in samples[name])
    if LLAMA_CACHED in samples and values["prefix_hits_total"] is None:
        cached = sum(s.value for s in samples[LLAMA_CACHED])
        values["prefix_hits_total"], names["prefix_hits_total"] = cached, LLAMA_CACHED
        if values["prompt_tokens_total"] is not None:  # llama.cpp's excludes the cached tokens
            values["prefix_queries_total"] = values["prompt_tokens_total"] + cached
            names["prefix_queries_total"] = f"{names['prompt_tokens_total']} + {LLAMA_CACHED}"
    return MetricsRead(values, tuple(sorted(samples)), _pool(samples), names)


def _pool(samples: dict[str, list]) -> dict[str, str]:
    """The KV pool from a read's samples: vLLM's cache_config_info labels, SGLang's
    cache_config_info pages (before its max_total_num_tokens), else SGLang's tokens."""
    if "vllm:cache_config_info" in samples:
        return {**samples["vllm:cache_config_info"][0].labels, "source": "vllm:cache_config_info"}
    if "sglang:cache_config_info" in samples:
        labels = samples["sglang:cache_config_info"][0].labels
        return {
            "num_gpu_blocks": labels.get("num_pages", ""),
            "block_size": labels.get("page_size", ""),
            "source": "sglang:cache_config_info",
        }
    if "sglang:max_total_num_tokens" in samples:
        pool = {
            "pool_tokens": str(int(samples["sglang:max_total_num_tokens"][0].value)),
            "source": "sglang:max_total_num_tokens",
        }
        if "sglang:page_size" in samples:
            pool["block_size"] = str(int(samples["sglang:page_size"][0].value))
        return pool
    return {}


def pool_numbers(pool: dict[str, str]) -> tuple[int | None, int | None, int | None, str | None]:
    """(num_gpu_blocks, block_size, pool tokens, cache dtype) from a read's ``pool`` labels; None
    for what is missing or not a positive whole number."""

    def number(key: str) -> int | None:
        try:
            value = int(float(pool[key]))
        except (KeyError, ValueError):
            return None
        return value if value > 0 else None

    blocks, block_size = number("num_gpu_blocks"), number("block_size")
    tokens = number("pool_tokens") or (blocks * block_size if blocks and block_size else None)
    return blocks, block_size, tokens, pool.get("cache_dtype")
