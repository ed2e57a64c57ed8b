"""A streamed OpenAI answer -> one finished request: text chunks, token times, token counts.

Rules (the report's definitions say the same):

- A chunk *carries text* when its ``choices[0].text`` (completions) or ``delta.content``,
  ``delta.reasoning_content`` or ``delta.reasoning`` (chat) is non-empty. TTFT ends at the first
  such chunk, never at a role-only or empty one (transformers serve's first chunk holds only the
  role).
- Output tokens: the server's ``usage.completion_tokens`` (``stream_options.include_usage``);
  else the text tokenized with the workload's tokenizer; else one per text chunk. The source is
  recorded per request (``usage`` | ``tokenizer`` | ``chunks``).
- A chunk carrying k tokens puts k equal times in ``token_times`` (its arrival). k is 1 per chunk
  when the counts agree; otherwise each chunk's share of the tokenized text (prefix counts),
  with the last chunk taking up any difference to the total.
- TTFO (time to first output) ends at the first chunk whose ``delta.content`` is non-empty, the
  first answer token (GuideLLM PR #760 and AIPerf's time_to_first_output): set only when the
  stream carried reasoning text, else None. TTFT keeps ending at the first text of any kind.
- Cached prompt tokens: the server's ``usage.prompt_tokens_details.cached_tokens`` (OpenAI's
  field; vLLM sends it when started with ``--enable-prompt-tokens-details``), else 0: the prefix
  cache hits of the request, which a calibration on the run prices as computed nowhere
  (kvplan.run.sim.calibration.client_steps).
- ``kv_transfer_s``: a chunk's top-level field of that name (engine.serve.router puts it in its
  last chunk: the seconds the request's KV took to move between a prefill and a decode server).
- A request *fails* (finish_reason ``error``, detail = the reason) on an HTTP error, a timeout,
  a dropped connection, an error event, a stream that ends without a finish reason, or no text
  at all (``empty output``); an HTTP 429 is no failure but a refusal (finish_reason ``rejected``,
  detail the server's message: kvplan.run.server.client.rejection).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from kvplan.results.stats.shed import REJECTED
from kvplan.run.driver import Finished
from kvplan.run.server.client import HttpResult, rejection

CountTokens = Callable[[str], int]  # text -> tokens, the workload's tokenizer


REASONING_KEYS = ("reasoning_content", "reasoning")  # vLLM's and SGLang's reasoning deltas (and older vLLM's)


def _text(choice: dict) -> tuple[str, str]:
    """(reasoning text, answer text) of one choice."""
    if "delta" in choice:
        delta = choice.get("delta") or {}
        reasoning = "".join(v for k in REASONING_KEYS if isinstance(v := delta.get(k), str))
        content = delta.get("content")
        return reasoning, content if isinstance(content, str) else ""
    if "message" in choice:  # a non-streaming chat answer
        return "", (choice.get("message") or {}).get("content") or ""
    text = choice.get("text")
    return "", text if isinstance(text, str) else ""


def chunk_tokens(texts: Sequence[str], total: int, count: CountTokens | None) -> list[int]:
    """Tokens per text chunk, summing to ``total`` (see the module docstring)."""
    n = len(texts)
    if n == 0:
        return []
    if total == n:
        return [1] * n
    if count is not None:
        shares, done, so_far = [], 0, ""
        for text in texts:
            so_far += text
            now = count(so_far)
            shares.append(max(0, now - done))
            done = max(done, now)
    else:
        shares = [1] * n
    diff = total - sum(shares)
    i = n - 1
    while diff < 0 and i >= 0:  # too many: take from the last chunks first
        take = min(shares[i], -diff)
        shares[i] -= take
        diff += take
        i -= 1
    shares[-1] += max(diff, 0)
    return shares


def to_finished(
    result: HttpResult, *, arrival_time: float, num_prompt_tokens: int, count_tokens: CountTokens | None
) -> Finished:
    """One finished request from a worker's raw result (see the module docstring).
    ``arrival_time``: its scheduled arrival (open loop), else when it was sent."""
    chunks: list[tuple[float, str]] = []
    usage, finish_reason, error = None, None, result.error
    transfer: float | None = None
    last_time = result.end_time
    reasoned, first_answer = False, None  # TTFO: the first answer chunk, where reasoning came first
    for at, payload in result.events:
        if payload == b"[DONE]":
            break
        try:
            obj = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            error = error or "bad chunk"
            break
        if not isinstance(obj, dict):
            continue
        if obj.get("error") is not None or obj.get("object") == "error":
            error = error or "error event"
            break
        if obj.get("usage"):
            usage = obj["usage"]
        if isinstance(obj.get("kv_transfer_s"), (int, float)):  # engine.serve.router's extra field
            transfer = float(obj["kv_transfer_s"])
        for choice in obj.get("choices") or []:
            reasoning, answer = _text(choice)
            if reasoning:
                reasoned = True
            if answer and first_answer is None:
                first_answer = at
            if reasoning or answer:
                chunks.append((at, reasoning + answer))
            if choice.get("finish_reason"):
                finish_reason = choice["finish_reason"]
        last_time = at
    texts = [text for _, text in chunks]
    if not error and finish_reason is None:
        error = "stream ended early"
    if not error and not chunks:
        error = "empty output"
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        total, source = usage["completion_tokens"], "usage"
    elif count_tokens is not None and texts:
        total, source = count_tokens("".join(texts)), "tokenizer"
    else:
        total, source = len(texts), "chunks"
    times = [at for (at, _), k in zip(chunks, chunk_tokens(texts, total, count_tokens)) for _ in range(k)]
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    refused = rejection(result)  # HTTP 429: shed by the server (kvplan.run.server.client.rejection)
    return Finished(
        request_id=result.request_id,
        arrival_time=arrival_time,
        first_scheduled_time=None,
        finish_time=last_time if not error else result.end_time,
        token_times=tuple(times),
        num_prompt_tokens=prompt if isinstance(prompt, int) else num_prompt_tokens,
        num_output_tokens=len(times),
        num_cached_tokens=cached if isinstance(cached, int) and cached >= 0 else 0,
        finish_reason=REJECTED if refused is not None else "error" if error else str(finish_reason),
        finish_detail=refused if refused is not None else error,
        sent_time=result.sent_time,
        output_tokens_source=source,
        first_output_time=first_answer if reasoned and not error else None,
        kv_transfer_s=transfer,
    )
