"""The OpenAI-compatible request bodies of ``python -m engine.serve``: checked at the edge, then
turned into what the engine runs; and the JSON the server answers with.

A body is checked whole before anything reaches the engine loop: malformed JSON, a known field
of the wrong type, ``max_tokens`` < 1, ``n`` other than 1, a prompt that is empty, holds a token
id outside the vocabulary, or with ``max_tokens`` exceeds ``max_model_len`` (or the whole KV
pool) are each a ``BadRequest`` (HTTP 400 with a message), never an exception in the loop.
Unknown fields are ignored, as OpenAI clients send many. Sampling fields as vLLM reads them:
``temperature`` (default 1.0; below 1e-5 greedy), ``top_p``, ``seed``, ``ignore_eos``,
``min_tokens``, ``cache_salt`` (enters the first block's prefix-cache hash); ``user`` (a string,
OpenAI's end-user id) may name the tenant (engine.serve.app). With ``--max-output-tokens`` a
larger ``max_tokens`` is clamped to it before these checks (engine.admission); with a KV budget a
request that needs more blocks than the budget alone is a 400, as one over the whole pool is.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.request import SamplingParams

TokenIds = list[Annotated[int, Field(strict=True)]]
JobKind = Literal["completion", "chat"]  # the endpoint: /v1/completions or /v1/chat/completions


class BadRequest(ValueError):
    """A body the server refuses: HTTP ``status`` (400) with ``message``."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


class _Body(BaseModel):
    # extra: OpenAI clients send fields the engine has no use for (user, logit_bias=None, ...)
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, allow_inf_nan=False, strict=False)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1, strict=False)] = 1.0
    seed: Annotated[int, Field(ge=0, lt=2**64)] | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    stop: None = None  # stop strings are not supported: refused rather than ignored
    logprobs: None | Literal[False] = None
    user: str | None = None  # OpenAI's end-user id: a tenant (engine.serve.app.tenant_of)


class CompletionBody(_Body):
    prompt: str | TokenIds | list[str] | list[TokenIds]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) != 1:
                raise ValueError("one prompt per request (batched prompts are not supported)")
            value = value[0]
        if len(value) == 0:
            raise ValueError("must not be empty")
        return value


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatBody(_Body):
    messages: Annotated[list[Message], Field(min_length=1)]


@dataclass(frozen=True)
class Job:
    """A checked request: what the engine runs and how to answer."""

    kind: JobKind
    model: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    cache_salt: str | None
    stream: bool
    include_usage: bool
    user: str | None = None
    tenant: str | None = field(default=None, compare=False)  # set by the app (engine.serve.app.tenant_of)


@dataclass(frozen=True)
class Limits:
    """What a body is checked against: the served name, vocabulary, max_model_len, KV pool;
    admission's output cap and KV budget (blocks), None when off."""

    model: str
    vocab_size: int
    max_model_len: int
    block_size: int
    num_blocks: int
    max_output_tokens: int | None = None
    budget_blocks: int | None = None


# the query parameters a router passes a prefill server: its decode server's limits (check_fit)
DECODE_LIMITS = ("decode_max_model_len", "decode_block_size", "decode_num_blocks")


def check_fit(num_prompt: int, max_tokens: int, limits: Limits, whose: str = "") -> None:
    """Raise BadRequest unless a request of ``num_prompt`` + ``max_tokens`` tokens fits a server of
    ``limits``: within max_model_len, and blocks for all but its last token (which needs no slot)
    within the whole KV pool (the scheduler's cannot_fit rule). ``whose``: a prefix naming the
    server checked, e.g. "the decode server: " (a router checks the decode pool at the prefill server)."""
    if num_prompt + max_tokens > limits.max_model_len:
        raise BadRequest(
            f"{whose}this model's maximum context length is {limits.max_model_len} tokens; the request has"
            f" {num_prompt} prompt tokens and max_tokens {max_tokens}"
        )
    if -(-(num_prompt + max_tokens - 1) // limits.block_size) > limits.num_blocks:
        raise BadRequest(
            f"{whose}the request ({num_prompt} + {max_tokens} tokens) needs more than the KV pool's"
            f" {limits.num_blocks} blocks of {limits.block_size} tokens"
        )


def parse_body(raw: bytes, kind: JobKind, limits: Limits, tokenizer) -> Job:
    """``raw`` JSON -> a Job, or BadRequest naming the field at fault (see the module docstring).
    ``tokenizer``: the model's (transformers) tokenizer, None for a model without one."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadRequest(f"malformed JSON body ({err})") from None
    except RecursionError:  # json's decoder recurses once per nesting level: [[[[...]]]] 3,000 deep
        raise BadRequest("malformed JSON body (nested too deeply)") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    try:
        body: ChatBody | CompletionBody = (
            ChatBody.model_validate(data) if kind == "chat" else CompletionBody.model_validate(data)
        )
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise BadRequest(
            f"{where}: {first['msg']} [+{err.error_count() - 1} more]"
            if err.error_count() > 1
            else f"{where}: {first['msg']}"
        ) from None
    if body.model is not None and body.model != limits.model:
        raise BadRequest(f"model: {body.model!r} is not served here; this server serves {limits.model!r}", 404)
    ids = _prompt_ids(body, tokenizer)
    if not all(0 <= t < limits.vocab_size for t in ids):
        raise BadRequest(f"prompt: every token id must be in [0, {limits.vocab_size})")
    max_tokens = body.max_completion_tokens or body.max_tokens or 16
    min_tokens = body.min_tokens
    if limits.max_output_tokens is not None and max_tokens > limits.max_output_tokens:  # clamped, as vLLM does
        max_tokens = limits.max_output_tokens
        min_tokens = min(min_tokens, max_tokens)
    check_fit(len(ids), max_tokens, limits)
    if limits.budget_blocks is not None and -(-(len(ids) + max_tokens - 1) // limits.block_size) > limits.budget_blocks:
        raise BadRequest(
            f"the request ({len(ids)} + {max_tokens} tokens) needs more than the KV admission budget of"
            f" {limits.budget_blocks} blocks of {limits.block_size} tokens"
        )
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            ignore_eos=body.ignore_eos,
            min_tokens=min_tokens,
        )
    except ValueError as err:
        raise BadRequest(str(err)) from None
    usage = bool((body.stream_options or {}).get("include_usage"))
    return Job(kind, limits.model, tuple(ids), params, body.cache_salt, body.stream, usage, body.user)


def _prompt_ids(body: ChatBody | CompletionBody, tokenizer) -> list[int]:
    if isinstance(body, ChatBody):  # kind "chat"
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise BadRequest("messages: this model has no chat template; use /v1/completions")
        try:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        except ValueError as err:
            raise BadRequest(f"messages: {err}") from None
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
    if isinstance(body.prompt, str):
        if tokenizer is None:
            raise BadRequest("prompt: this model has no tokenizer; send token ids")
        return list(tokenizer(body.prompt)["input_ids"])
    return list(cast(list[int], body.prompt))  # token ids: _one_prompt unwrapped a batch of one


# ---- answers ----------------------------------------------------------------------------------
def error_body(message: str, status: int) -> dict[str, Any]:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 429: "RateLimitError"}.get(
        status, "ServerError"
    )
    return {"error": {"message": message, "type": kind, "code": status}}


def usage(num_prompt: int, num_output: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt, "completion_tokens": num_output, "total_tokens": num_prompt + num_output}


def chunk(job: Job, request_id: str, text: str | None, finish_reason: str | None, role: bool = False) -> dict:
    """One streamed chunk (``text`` None: the chat's role-only first chunk)."""
    if job.kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": job.model, "choices": [choice]}


def usage_chunk(job: Job, request_id: str, num_prompt: int, num_output: int) -> dict:
    obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
    return {
        "id": request_id,
        "object": obj,
        "created": int(time.time()),
        "model": job.model,
        "choices": [],
        "usage": usage(num_prompt, num_output),
    }


def full_response(job: Job, request_id: str, text: str, finish_reason: str, num_output: int) -> dict:
    if job.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {
        "id": request_id,
        "object": obj,
        "created": int(time.time()),
        "model": job.model,
        "choices": [choice],
        "usage": usage(len(job.prompt_token_ids), num_output),
    }
