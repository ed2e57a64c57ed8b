"""What a run against a remote server (``source: target``) records beside its requests: the server
as the pre-flight found it (``ServerInfo``) and the load client's own cost per level
(``ClientLevel``). Both are parts of the run result (kvplan.results.run_result re-exports them).

A value the server does not expose is None (``unavailable`` in the report), never 0.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Part(BaseModel):
    # frozen; a field a newer kvplan adds is ignored when an older one reads the file
    model_config = ConfigDict(frozen=True, extra="ignore")


class ServerInfo(_Part):
    """A remote target as the pre-flight found it. ``kind``: whose server it says it is (the
    ``owned_by`` of /v1/models: vllm, sglang, llamacpp, kvplan-engine, ...). The KV pool
    (``num_gpu_blocks`` x ``block_size``: vLLM's ``cache_config_info``, SGLang's
    ``cache_config_info`` pages; else SGLang's pool in tokens, or llama.cpp's slots x per-slot
    context, ``pool_tokens``) is None where the server does not expose it, never 0.
    ``pool_note``: the pool beside kvplan's estimate for the served model, mismatch stated."""

    url: str
    model: str
    api: str
    kind: str | None = None
    metrics_available: bool = False
    metrics_seen: list[str] = []
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    pool_tokens: int | None = None
    cache_dtype: str | None = None
    exact_lengths: bool = False
    prompt_format: str = "text"
    scrape_interval_ms: int | None = None
    pool_note: str | None = None
    pool_source: str | None = Field(
        None, description="Where the pool came from: a /metrics name or llama.cpp's /props; null: not exposed."
    )
    num_slots: int | None = Field(None, description="llama.cpp: total_slots of /props (--parallel); null elsewhere.")
    slot_ctx_tokens: int | None = Field(None, description="llama.cpp: one slot's context, tokens (/props n_ctx).")
    kv_usage_metric: str | None = Field(
        None, description="The /metrics name the server's KV usage column was read from; null: none exposed."
    )
    kv_usage_note: str | None = Field(
        None,
        description="Null when kv_usage_metric is KV cache usage; else what it measures instead (SGLang's"
        " token_usage on a hybrid model also counts its Mamba or sliding-window pool).",
    )
    vocab_size: int | None = Field(None, description="The vocabulary random prompt token ids were drawn from.")
    vocab_source: str | None = Field(None, description="Where vocab_size came from (setting, tokenizer, model).")


class ClientLevel(_Part):
    """The load client's own overhead during one level of a target run: its event loops' lag
    (how late a 5 ms timer fired: an upper bound on how late a chunk's timestamp can be) and the
    CPU its workers used. ``behind`` (kvplan.run.server.client_lag): the client's own delay is a
    material share of what the level measured: the time-weighted loop lag P99
    (``stamp_delay_p99_ms``) above 5 % of the level's TTFT P50, or, open loop, the P99 of its sends'
    delays after their scheduled arrivals above a tenth of the mean inter-arrival time;
    ``behind_reason`` says which. Runs before that rule judged lag P99 > 1 ms or a send > 10 ms
    late."""

    bucket: str
    mode: str
    level: int | float
    variant: str = ""
    workers: int
    lag_p99_ms: float | None
    lag_max_ms: float | None
    cpu_s: float
    wall_s: float
    behind: bool = False
    stamp_delay_p99_ms: float | None = Field(
        None,
        description="P99 over time of how late a chunk arriving at a random moment is stamped, ms: each"
        " timer lateness weighted by the time its tick spans.",
    )
    ttft_p50_ms: float | None = Field(None, description="The level's TTFT P50 the lag is judged against, ms.")
    send_delay_p99_ms: float | None = Field(
        None, description="Open loop: P99 of sends after their scheduled arrival, ms; null closed loop."
    )
    mean_interarrival_ms: float | None = Field(
        None, description="Open loop: 1000 / the level's rate, ms; null closed loop."
    )
    behind_reason: str = Field("", description="Why the level is marked behind; empty when it is not.")
