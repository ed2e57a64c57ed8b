"""The workload's ``target:`` section: load-test a running OpenAI-compatible server instead of the
bundled engine (``kvplan loadtest WORKLOAD --target URL`` sets or overrides ``url``).

Example::

    target:
      url: http://gpu-box:8000/v1        # the server's OpenAI base URL
      model: meta-llama/Llama-3.1-8B-Instruct   # default: the first id of GET /v1/models
      api: completions                   # completions | chat
      api_key_env: SERVER_API_KEY        # the NAME of an environment variable holding the key
      timeout_s: 600                     # per request, connect to last chunk
      extra_body: {top_k: 1}             # added to every request body as is
      estimate_model: llama-3.1-8b       # kvplan's estimate: a preset, config.json or GGUF (--model)
      gpu: H100-80GB                     # optional: also size the pool as kvplan would on this GPU

The buckets, levels, SLO, report, compare and gate are the workload's own; the ``engine:``
section does not apply (the server is what runs), except that its ``model`` names the tokenizer
when ``tokenizer`` is not given and the bundled engine knows that model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvplan.errors import KvplanError
from kvplan.sizing import dtypes


class TargetSettings(BaseModel):
    """A running OpenAI-compatible server to load-test instead of the bundled engine (the
    workload's ``target:`` section)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    url: str | None = Field(
        None,
        description="The server's OpenAI base URL, http:// or https:// (``http://gpu-box:8000/v1``, a"
        " trailing / dropped); required, here or as ``--target``.",
    )
    model: str | None = Field(
        None,
        description="The model id every request names; null = the first id of the server's GET /v1/models"
        " (an id given must be listed there).",
    )
    api: Literal["completions", "chat"] = Field(
        "completions",
        description="The endpoint requests go to: ``completions`` (/v1/completions, a prompt) or"
        " ``chat`` (/v1/chat/completions, one user message of text).",
    )
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = Field(
        None,
        description="The NAME of an environment variable holding the server's API key, sent as a Bearer"
        " token (the key itself never goes in the file); null = no key.",
    )
    timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        600.0,
        description="The timeout of one request, s, from connecting to its last streamed chunk; a request"
        " over it fails with reason timeout.",
    )
    extra_body: dict[str, Any] = Field(
        {},
        description="JSON fields added to every request body as they are (``{top_k: 1}``), replacing"
        " kvplan's own of the same name.",
    )
    exact_lengths: Literal["auto"] | bool = Field(
        "auto",
        description="Whether to ask for exactly max_tokens output tokens (ignore_eos + min_tokens), else"
        " send max_tokens alone and report the lengths achieved; ``auto`` = where the server"
        " is known to honour them (vLLM, SGLang, engine.serve).",
    )
    prompt_format: Literal["auto", "text", "token_ids"] = Field(
        "auto",
        description="How prompts are sent: ``token_ids`` (the sampled ids, which vLLM, SGLang and"
        " engine.serve take on /v1/completions), ``text`` (their decoded text) or ``auto`` ="
        " token_ids to those servers, else text when there is a tokenizer; the chat API always sends text.",
    )
    tokenizer: str | None = Field(
        None,
        description="A tokenizer.json or a folder holding one, relative to the workload file (read with the"
        " tokenizers package, no torch); null = engine.model's (none for tiny-random-llama).",
    )
    vocab_size: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="Random prompts draw token ids from [0, vocab_size); null = the tokenizer's vocabulary"
        " size, else the one kvplan knows for estimate_model or the engine section's model (needed only"
        " when none of these says it).",
    )
    metrics_url: str | None = Field(
        None,
        description="The server's Prometheus /metrics URL, http:// or https://; null = the url's server root"
        " + /metrics (``http://gpu-box:8000/metrics`` for ``http://gpu-box:8000/v1``).",
    )
    scrape_interval_ms: Annotated[int, Field(ge=10, le=60_000)] = Field(
        100, description="How often /metrics is read during a level (besides at its start and end), ms."
    )
    workers: Literal["auto"] | Annotated[int, Field(ge=1, le=64)] = Field(
        "auto",
        description="Client processes, each one asyncio event loop; ``auto`` = one per 250 streams of the"
        " widest closed-loop level (up to the CPU count), as one loop on one core tops out"
        " there.",
    )
    estimate_model: str | None = Field(
        None,
        description="The served model for kvplan's KV estimate beside the server's pool: a preset,"
        " config.json or GGUF (``--model`` sets it); null = no estimate.",
    )
    gpu: str | None = Field(
        None,
        description="The server's GPU, by kvplan's name, to also size the KV pool as kvplan would there and"
        " state how far the server's is from it; null = no such sizing.",
    )
    tp: Annotated[int, Field(ge=1)] = Field(
        1, description="The server's tensor parallelism, for kvplan's KV bytes per token per GPU rank."
    )
    kv_cache_dtype: str = Field(
        "auto",
        description="The server's KV cache dtype for kvplan's estimate: ``auto`` = the cache_dtype its"
        " /metrics names, else the model's; or ``bf16``, ``fp16``, ``fp32``, ``fp8``, ``int8``,"
        " ``int4``.",
    )

    @field_validator("url", "metrics_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1].strip("/")) == 0:
            raise ValueError(f"must be an http:// or https:// URL such as http://localhost:8000/v1 (got {value!r})")
        return value.rstrip("/")

    @field_validator("kv_cache_dtype", mode="before")
    @classmethod
    def _kv_dtype(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return dtypes.canonical(value, allowed=tuple(dtypes.DTYPES))
        except KvplanError as err:
            raise ValueError(f"{err.problem}; {err.fix}") from None

    @property
    def server_root(self) -> str:
        """``http://host:8000`` for ``http://host:8000/v1``: where /metrics and /health live."""
        url = self.url
        assert url is not None  # a target run's (with_target requires it)
        return url[: -len("/v1")] if url.endswith("/v1") else url

    @property
    def scrape_url(self) -> str:
        return self.metrics_url or f"{self.server_root}/metrics"
