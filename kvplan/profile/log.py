"""Read a request log for ``kvplan profile``: one request a JSONL line, in one of three formats
(CSV traces, and logs read through ``--columns``: kvplan.profile.csv_traces, which sends JSONL here).

Each line is read on its own, its format told by its keys (or forced with ``fmt``):

- ``kvplan``: a kvplan run's ``requests.jsonl`` (kvplan.results.records.RequestRecord): a line with
  ``request_id``, ``arrival_time`` and ``num_prompt_tokens``. Lengths are ``num_prompt_tokens`` and
  ``max_tokens``, times ``arrival_time`` and ``finish_time`` (s), the prefix reuse the engine's own
  ``num_cached_tokens`` (no token ids are recorded), a session the level's id plus ``session``.
- ``mooncake``: a Mooncake trace line (github.com/kvcache-ai/Mooncake, FAST'25 traces): a line with
  ``hash_ids`` or ``input_length``. ``timestamp`` in ms, ``input_length``, ``output_length`` and
  ``hash_ids``, one per 512-token block; requests sharing a hash id share that block's tokens. Each
  hash id h becomes 512 token ids ``numpy.random.default_rng([h]).integers(0, 2**15, 512)``, so equal
  ids give equal tokens (and a kvplan block hash chain sees the sharing); the prompt is cut to
  ``input_length``.
- ``openai``: any other line, an OpenAI-style request log: ``timestamp`` (s, or an ISO 8601 string)
  or ``created`` (s); ``prompt`` (text) or ``messages`` ([{role, content}], laid out in ChatML,
  SmolLM2-135M-Instruct's chat template, so a conversation's history is a shared prefix; a
  ``content`` is text or the OpenAI chat API's list of content parts: its ``text`` parts joined with
  a newline, as vLLM joins them for a text-only chat template, its other parts, such as
  ``image_url``, left out);
  ``output``/``completion`` (text) or ``usage: {prompt_tokens, completion_tokens}`` (used for the
  lengths when given); optional ``session_id``/``conversation_id``, and ``latency_s`` or
  ``e2e_ms`` for the finish time. Text is tokenized with the ``tokenize`` given.

The file is UTF-8, a byte order mark at its start allowed, lines ended by LF or CRLF. A line that
cannot be read (not UTF-8, not JSON, nested too deeply, a length above ``MAX_TOKENS``, a time beyond
``MAX_SECONDS``) becomes a ``BadLine`` (``line N: field: problem``), never an error; only a log
without one good line is (``KvplanError``, exit 2).
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np

from kvplan.errors import KvplanError

LogFormat = Literal["auto", "openai", "mooncake", "kvplan"]
FORMATS: tuple[str, ...] = ("auto", "openai", "mooncake", "kvplan")
MOONCAKE_BLOCK = 512  # tokens per Mooncake hash id (the traces' block size)
MOONCAKE_VOCAB = 2**15  # token ids a Mooncake block is expanded into: [0, 2**15)
Tokenize = Callable[[list[str]], list[list[int]]]


@dataclass(frozen=True)
class LoggedRequest:
    """One good line. ``arrival_s``/``finish_s``: seconds on the log's clock (finish None: unknown);
    ``token_ids``: the prompt's ids (None: not known, e.g. a kvplan record); ``cached_tokens``: the
    prompt tokens the serving engine found cached (kvplan records only); ``user_turns``: user
    messages in ``messages`` (None without)."""

    line: int
    fmt: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    token_ids: tuple[int, ...] | None = None
    session: str | None = None
    finish_s: float | None = None
    cached_tokens: int | None = None
    user_turns: int | None = None
    level: str | None = None  # a kvplan record's load level, as its LevelKey.id (short/open/2/cached)


@dataclass(frozen=True)
class BadLine:
    """A line left out: ``line N: field: problem``."""

    line: int
    field: str
    problem: str

    def describe(self) -> str:
        return f"line {self.line}: {self.field}: {self.problem}"


@dataclass(frozen=True)
class ParsedLog:
    """A log's good requests, in arrival order (ties in line order), and its bad lines."""

    source: str
    requests: tuple[LoggedRequest, ...]
    bad_lines: tuple[BadLine, ...] = field(default=())
    levels: tuple[str, ...] = ()  # a kvplan run's load levels, in file order (() for other logs)
    level: str | None = None  # the one kept
    notes: tuple[str, ...] = ()  # what the numbers leave out, one line each (the CLI warns with them)
    log_format: str | None = None  # the file's format, as its header or first line tells it (csv_traces)
    num_failed: int = 0  # rows of failed requests left out (a BurstGPT row with 0 response tokens)


# a read line: request, hash ids, prompt, output, content parts left out (read_line)
LineRead = tuple[LoggedRequest, list[int] | None, str | None, str | None, tuple[str, ...]]


class _Bad(Exception):
    def __init__(self, field: str, problem: str):
        super().__init__(problem)
        self.field, self.problem = field, problem


def _number(row: dict, key: str, *, minimum: float | None = 0) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Bad(key, "missing" if value is None else f"must be a number (got {value!r})")
    if minimum is not None and value < minimum:
        raise _Bad(key, f"must be >= {minimum:g} (got {value!r})")
    return float(value)


# a length beyond any context window is a broken line, not a request: the workload schema's cap
# (kvplan.workload.lengths.MAX_TOKENS), which also bounds a Mooncake line's hash ids to 32,768 blocks
MAX_TOKENS = 2**24
MAX_SECONDS = 1e15  # a time beyond 30 million years is a broken line; keeps differences of times finite
# One request a line: a line over this is not a log record (/dev/zero, a binary file without a LF,
# read as one line until memory ran out); a 1M-token prompt's text is some 4 MB
MAX_LINE_BYTES = 64 * 2**20


def _seconds(value: float, key: str) -> float:
    if abs(value) > MAX_SECONDS:
        raise _Bad(key, f"must be within +-{MAX_SECONDS:g} s (got {value:.3g})")
    return value


def _count(row: dict, key: str) -> int:
    value = _number(row, key)
    if value > MAX_TOKENS:
        raise _Bad(key, f"must be at most {MAX_TOKENS:,} tokens (got {value:.3g})")
    if value != int(value):
        raise _Bad(key, f"must be a whole number of tokens (got {value!r})")
    return int(value)


def detect(row: dict) -> str:
    """The format a line's keys say (see the module docstring)."""
    if "request_id" in row and "num_prompt_tokens" in row and "arrival_time" in row:
        return "kvplan"
    if "hash_ids" in row or "input_length" in row:
        return "mooncake"
    return "openai"


def mooncake_block(hash_id: int) -> tuple[int, ...]:
    """The 512 token ids a Mooncake hash id stands for (deterministic: equal ids, equal tokens)."""
    return tuple(int(t) for t in np.random.default_rng([hash_id]).integers(0, MOONCAKE_VOCAB, MOONCAKE_BLOCK))


def _kvplan(line: int, row: dict) -> LoggedRequest:
    arrival = _seconds(_number(row, "arrival_time", minimum=None), "arrival_time")
    finish = row.get("finish_time")
    session = row.get("session")
    value = row.get("level")
    level = f"{row.get('bucket', '')}/{row.get('mode', '')}/{value:g}" if isinstance(value, int | float) else ""
    level += f"/{row['variant']}" if row.get("variant") else ""
    return LoggedRequest(
        line,
        "kvplan",
        arrival,
        _count(row, "num_prompt_tokens"),
        _count(row, "max_tokens") if "max_tokens" in row else _count(row, "num_output_tokens"),
        finish_s=_seconds(_number(row, "finish_time", minimum=arrival), "finish_time") if finish is not None else None,
        cached_tokens=_count(row, "num_cached_tokens") if "num_cached_tokens" in row else None,
        session=f"{level}/{session}" if session is not None else None,
        level=level,
    )


def _mooncake(line: int, row: dict) -> tuple[LoggedRequest, list[int] | None]:
    """The request and its prompt's hash ids, cut to its blocks (None: no ids, or fewer blocks than
    the prompt, so its tokens are not all known)."""
    arrival = _seconds(_number(row, "timestamp", minimum=None) / 1000.0, "timestamp")
    num_input, num_output = _count(row, "input_length"), _count(row, "output_length")
    hash_ids = row.get("hash_ids", [])
    if not isinstance(hash_ids, list) or (hash_ids and (set(map(type, hash_ids)) - {int, bool} or min(hash_ids) < 0)):
        raise _Bad("hash_ids", "must be a list of integers >= 0")
    needed = -(-num_input // MOONCAKE_BLOCK)
    chain = hash_ids[:needed] if hash_ids and len(hash_ids) >= needed else None
    request = LoggedRequest(line, "mooncake", arrival, num_input, num_output, finish_s=_finish(row, arrival))
    return request, chain


def mooncake_tokens(hash_ids: list[int], num_input: int, blocks: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    """The prompt's token ids: its hash ids' blocks (kept in ``blocks``), cut to ``num_input``."""
    ids: list[int] = []
    for h in hash_ids:
        block = blocks.get(h) or blocks.setdefault(h, mooncake_block(h))
        ids.extend(block)
    return tuple(ids[:num_input])


def _finish(row: dict, arrival: float) -> float | None:
    if row.get("latency_s") is not None:
        return _seconds(arrival + _number(row, "latency_s"), "latency_s")
    if row.get("e2e_ms") is not None:
        return _seconds(arrival + _number(row, "e2e_ms") / 1000.0, "e2e_ms")
    return None


def _timestamp(row: dict) -> float:
    key = "timestamp" if "timestamp" in row else "created"
    value = row.get(key)
    if isinstance(value, str):
        try:
            return _seconds(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp(), key)
        except (ValueError, OverflowError):
            raise _Bad(key, f"is not an ISO 8601 time (got {value!r})") from None
    if value is None:
        raise _Bad("timestamp", "missing (give timestamp or created)")
    return _seconds(_number(row, key, minimum=None), key)


def message_text(i: int, message: object) -> tuple[str, tuple[str, ...]]:
    """Message ``i``'s text and the types of the content parts left out of it. ``content`` is text,
    or a list of content parts ``{"type": "text", "text": ...}``, ``{"type": "image_url", ...}``
    (the OpenAI chat API's): the text parts joined with a newline, as vLLM joins them for a
    text-only chat template (vllm/entrypoints/chat_utils.py); every other part left out."""
    content = message.get("content", "") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        raise _Bad(f"messages[{i}]", "must be {role, content} with content text or a list of content parts")
    texts: list[str] = []
    left_out: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise _Bad(f"messages[{i}].content[{j}]", "must be a content part {type, ...}")
        if kind != "text":
            left_out.append(kind)
        elif isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise _Bad(f"messages[{i}].content[{j}].text", "must be text")
    return "\n".join(texts), tuple(left_out)


def chatml(messages: list) -> tuple[str, tuple[str, ...]]:
    """``messages`` in ChatML (SmolLM2-135M-Instruct's chat template), ending with the assistant's
    cue, and the types of the content parts left out (message_text)."""
    parts: list[str] = []
    left_out: list[str] = []
    for i, message in enumerate(messages):
        text, skipped = message_text(i, message)
        left_out.extend(skipped)
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{text}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n", tuple(left_out)


def _openai(line: int, row: dict) -> tuple[LoggedRequest, str | None, str | None, tuple[str, ...]]:
    """The request (lengths -1 where text is still to be tokenized), its prompt text, its output
    text and the types of the content parts left out of the prompt."""
    arrival = _timestamp(row)
    messages = row.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise _Bad("messages", "must be a list of {role, content}")
    prompt, left_out = chatml(messages) if messages is not None else (row.get("prompt"), ())
    if prompt is not None and not isinstance(prompt, str):
        raise _Bad("prompt", "must be text")
    raw_usage = row.get("usage")
    usage: dict = raw_usage if isinstance(raw_usage, dict) else {}
    num_input = _count(usage, "prompt_tokens") if "prompt_tokens" in usage else None
    num_output = _count(usage, "completion_tokens") if "completion_tokens" in usage else None
    output = row.get("output", row.get("completion"))
    if output is not None and not isinstance(output, str):
        raise _Bad("output", "must be text")
    if prompt is None and num_input is None:
        raise _Bad("prompt", "missing (give prompt, messages or usage.prompt_tokens)")
    if output is None and num_output is None:
        raise _Bad("output", "missing (give output, completion or usage.completion_tokens)")
    session = row.get("session_id", row.get("conversation_id"))
    turns = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "user") if messages else None
    request = LoggedRequest(
        line,
        "openai",
        arrival,
        num_input if num_input is not None else -1,
        num_output if num_output is not None else -1,
        session=str(session) if session is not None else None,
        finish_s=_finish(row, arrival),
        user_turns=turns,
    )
    return request, prompt, output if num_output is None else None, left_out


def file_lines(path: str | Path, fix: str) -> Iterator[tuple[int, int, bytes]]:
    """The non-blank lines of the file at ``path``, read as a stream: (its number from 1, the byte
    offset of its start, its bytes without the LF; a byte order mark at the file's start dropped).
    Lines end at LF (a CRLF's CR is whitespace to JSON and dropped from a CSV row): str.splitlines
    would also cut at the U+2028, U+0085 or form feed a JSON string may hold unescaped (no other
    UTF-8 character's bytes hold 0x0a); each line is decoded on its own by its reader, so one line
    that is not UTF-8 is a bad line, not an unreadable log.

    Raises:
        KvplanError: the file cannot be read, is gzip-compressed (``fix`` says what to give instead),
        has a line over MAX_LINE_BYTES or has no non-blank line.
    """
    source = str(path)
    try:
        with open(path, "rb") as file:
            if file.peek(2)[:2] == b"\x1f\x8b":
                raise KvplanError("", "is gzip-compressed", f"gunzip it and give the {fix} file", source=source)
            offset, any_line, n = 0, False, 0
            while raw := file.readline(MAX_LINE_BYTES + 1):
                n, start = n + 1, offset
                if len(raw) > MAX_LINE_BYTES:
                    raise KvplanError(
                        f"line {n}",
                        f"is over {MAX_LINE_BYTES // 2**20} MiB without a line break, so not one request",
                        f"check the path: give a {fix} file, one request a line",
                        source=source,
                    )
                offset += len(raw)
                if n == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw, start = raw[3:], start + 3
                raw = raw[:-1] if raw.endswith(b"\n") else raw
                if raw.strip():
                    any_line = True
                    yield n, start, raw
    except OSError as err:
        raise KvplanError("", f"cannot read the log ({err.strerror or err})", source=source) from None
    if not any_line:
        raise KvplanError("", "empty log", f"give a {fix} file, one request a line", source=source)


def read_line(n: int, raw: bytes, fmt: str, can_tokenize: bool) -> LineRead:
    """Line ``n`` (its bytes, ``fmt`` or auto): the request (lengths -1 where its text is still to be
    tokenized), a Mooncake line's hash ids (``_mooncake``), its prompt and output text to tokenize
    (None: none) and the types of the content parts left out of the prompt.

    Raises:
        _Bad: the line cannot be read; text without a tokenizer (``can_tokenize`` False).
    """
    row = _json_line(raw)
    if not isinstance(row, dict):
        raise _Bad("json", f"must be an object (got {type(row).__name__})")
    kind = detect(row) if fmt == "auto" else fmt
    if kind == "kvplan":
        return _kvplan(n, row), None, None, None, ()
    if kind == "mooncake":
        return (*_mooncake(n, row), None, None, ())
    request, prompt, output, skipped = _openai(n, row)
    if (prompt is not None or output is not None) and not can_tokenize:
        raise _Bad("prompt", "text needs a tokenizer to count its tokens (give --tokenizer)")
    return request, None, prompt, output, skipped


def _json_line(raw: bytes) -> object:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise _Bad("utf-8", f"not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1})") from None
    except json.JSONDecodeError as err:
        raise _Bad("json", f"not JSON ({err.msg})") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise _Bad("json", "nested too deeply to read") from None
