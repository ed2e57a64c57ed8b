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
  sglang/srt/metrics/collector.py SchedulerMetricsCollector): ``sglang:token_usage`` (0..1),
  ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:num_retracted_requests_total``
  (its preemptions, "retractions"; newer versions), ``sglang:cached_tokens_total`` (prefix-cache hit
  tokens) over ``sglang:prompt_tokens_total``, and the pool as ``sglang:max_total_num_tokens``
  (tokens) with ``sglang:page_size``.

A name the server does not expose leaves its field None (unavailable), never 0. Several label
sets of one name (data-parallel engines, several models) are summed, except usage, whose highest
value is kept. Only lines of these names are parsed, so a large exposition costs little.
"""

from __future__ import annotations

from dataclasses import dataclass

# field -> names in order of preference (the first one present wins)
FIELDS = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "num_running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "num_waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
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
}
POOL_NAMES = ("vllm:cache_config_info", "sglang:max_total_num_tokens", "sglang:page_size")
KNOWN = frozenset(n for names in FIELDS.values() for n in names) | frozenset(POOL_NAMES)


@dataclass(frozen=True)
class MetricsRead:
    """One read: ``values`` per FIELDS key (None: not exposed); ``seen`` the known names present."""

    values: dict[str, float | None]
    seen: tuple[str, ...]
    pool: dict[str, str]  # vllm:cache_config_info's labels, or SGLang's pool numbers as text


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
    for field, names in FIELDS.items():
        name = next((n for n in names if n in samples), None)
        if name is None:
            values[field] = None
        elif field == "kv_usage":
            values[field] = max(s.value for s in samples[name])
        else:
            values[field] = sum(s.value for s in samples[name])
    pool: dict[str, str] = {}
    if "vllm:cache_config_info" in samples:
        pool = dict(samples["vllm:cache_config_info"][0].labels)
    elif "sglang:max_total_num_tokens" in samples:
        pool = {"pool_tokens": str(int(samples["sglang:max_total_num_tokens"][0].value))}
        if "sglang:page_size" in samples:
            pool["block_size"] = str(int(samples["sglang:page_size"][0].value))
    return MetricsRead(values, tuple(sorted(samples)), pool)


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
