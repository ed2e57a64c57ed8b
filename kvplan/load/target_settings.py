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
from kvplan.plan import dtypes


class TargetSettings(BaseModel):
    """A remote server under test (see the module docstring).

    ``exact_lengths``: ask for exactly ``max_tokens`` tokens (``ignore_eos`` + ``min_tokens``);
    ``auto`` does so where the server is known to honour them (vLLM, SGLang, engine.serve) and
    otherwise sends ``max_tokens`` alone and reports the lengths achieved. ``prompt_format``:
    ``token_ids`` sends the sampled ids (vLLM, SGLang and engine.serve take them on
    /v1/completions), ``text`` their decoded text; ``auto`` sends text when there is a tokenizer.
    ``tokenizer``: a ``tokenizer.json`` or a folder holding one (read with the ``tokenizers``
    package, no torch). ``vocab_size``: the range of random token ids when there is no tokenizer.
    ``scrape_interval_ms``: how often ``/metrics`` is read (``metrics_url``, by default the URL's
    server root + ``/metrics``). ``workers``: client processes; ``auto`` adds one per 250 streams
    of the widest closed-loop level (up to the CPU count), since one event loop on one core
    tops out there.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    url: str | None = None  # required, here or as --target
    model: str | None = None
    api: Literal["completions", "chat"] = "completions"
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 600.0
    extra_body: dict[str, Any] = {}
    exact_lengths: Literal["auto"] | bool = "auto"
    prompt_format: Literal["auto", "text", "token_ids"] = "auto"
    tokenizer: str | None = None
    vocab_size: Annotated[int, Field(ge=1)] | None = None
    metrics_url: str | None = None
    scrape_interval_ms: Annotated[int, Field(ge=10, le=60_000)] = 100
    workers: Literal["auto"] | Annotated[int, Field(ge=1, le=64)] = "auto"
    estimate_model: str | None = None
    gpu: str | None = None
    tp: Annotated[int, Field(ge=1)] = 1
    kv_cache_dtype: str = "auto"

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
        return self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url

    @property
    def scrape_url(self) -> str:
        return self.metrics_url or f"{self.server_root}/metrics"
