"""A JSONL request log read whole (kvplan.profile.log's formats): every request kept, with its
prompt's token ids (a Mooncake line's blocks expanded, an OpenAI line's text tokenized in one
batch), in arrival order.

``kvplan profile`` reads logs as a stream instead (kvplan.profile.stream: memory bounded by the
distinct prefix blocks, not the tokens); this whole read is the reference the stream is tested
against, and what ``--replay`` writes its trace from (kvplan.profile.replay needs each prompt's
tokens). It holds every token id: a 4,000-line slice of a Mooncake trace (45 M prompt tokens) takes
some 2 GB.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.profile.log import (
    BadLine,
    LoggedRequest,
    ParsedLog,
    Tokenize,
    _Bad,
    file_lines,
    mooncake_tokens,
    read_line,
)


def read_log(
    path: str | Path, fmt: str = "auto", tokenize: Tokenize | None = None, level: str | None = None
) -> ParsedLog:
    """Every line of the log at ``path`` read as a request or a bad line.

    ``tokenize`` (texts -> token ids) is called once, batched, for the OpenAI lines' text (not at
    all for Mooncake and kvplan logs); without it an OpenAI line's text makes it a bad line. A
    kvplan run holds several load levels, each on its own clock: only ``level`` (a LevelKey id,
    ``short/open/2`` or ``short/closed/8/cached``; None: the first level in the file; ``all``:
    every one) is kept.

    Raises:
        KvplanError: an unreadable or gzip-compressed file, an empty log, a log without one good line (the first bad
        line named), or a ``level`` the run does not hold.
    """
    source = str(path)
    requests: list[LoggedRequest] = []
    bad: list[BadLine] = []
    texts: list[tuple[int, str | None, str | None]] = []  # index in requests, prompt, output
    blocks: dict[int, tuple[int, ...]] = {}
    left_out: Counter[str] = Counter()  # content parts left out of prompts whose length is their text's
    for n, _, raw in file_lines(path, "JSONL"):
        try:
            request, hash_ids, prompt, output, skipped = read_line(n, raw, fmt, tokenize is not None)
        except _Bad as err:
            bad.append(BadLine(n, err.field, err.problem))
            continue
        if hash_ids is not None:
            request = replace(request, token_ids=mooncake_tokens(hash_ids, request.input_tokens, blocks))
        if prompt is not None or output is not None:
            texts.append((len(requests), prompt, output))
        if request.input_tokens < 0:  # the length is the text's: what was left out matters
            left_out.update(skipped)
        requests.append(request)
    if texts and tokenize is not None:
        requests = tokenized(requests, texts, tokenize)
    if not requests:
        first = bad[0]
        raise KvplanError(f"line {first.line}: {first.field}", first.problem, source=source)
    levels = tuple(dict.fromkeys(r.level for r in requests if r.level is not None))
    check_level(level, levels, source)
    if levels and level != "all":
        kept = level if level is not None else levels[0]
        requests = [r for r in requests if r.level in (None, kept)]
        level = kept
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, requests[i].line))
    notes = (left_out_note(left_out),) if left_out else ()
    return ParsedLog(source, tuple(requests[i] for i in order), tuple(bad), levels, level if levels else None, notes)


def left_out_note(left_out: Counter[str]) -> str:
    """One line on the non-text content parts left out of prompts whose length is their text's."""
    total = sum(left_out.values())
    kinds = ", ".join(f"{kind}: {n}" for kind, n in left_out.most_common())
    return (
        f"prompts measured by their text leave out {total} non-text content part{'s' if total != 1 else ''}"
        f" ({kinds}); a line's usage.prompt_tokens counts them"
    )


def tokenized(
    requests: list[LoggedRequest], texts: list[tuple[int, str | None, str | None]], tokenize: Tokenize
) -> list[LoggedRequest]:
    """``requests`` with the texts' lengths and prompt token ids: ``texts`` holds (index in
    ``requests``, prompt, output), tokenized in one batch each; a length the line gave is kept."""
    prompts = tokenize([p or "" for _, p, _ in texts])
    outputs = tokenize([o or "" for _, _, o in texts])
    out = list(requests)
    for (i, prompt, output), prompt_ids, output_ids in zip(texts, prompts, outputs):
        request = out[i]
        ids = tuple(prompt_ids) if prompt is not None else None
        out[i] = replace(
            request,
            token_ids=ids,
            input_tokens=request.input_tokens if request.input_tokens >= 0 else len(prompt_ids),
            output_tokens=request.output_tokens if output is None else len(output_ids),
        )
    return out


def check_level(level: str | None, levels: tuple[str, ...], source: str) -> None:
    """That ``level`` (``--level``; None: the first, ``all``: every one) names one of the log's
    ``levels`` (a kvplan run's load levels; () for any other log).

    Raises:
        KvplanError: ``level`` not among ``levels``, or given at all for a log of no levels (it
            would be ignored: only a kvplan run's requests.jsonl holds load levels).
    """
    if level in (None, "all") or level in levels:
        return
    if not levels:
        raise KvplanError(
            "level",
            f"{level!r}: this log holds no load levels (only a kvplan run's requests.jsonl does)",
            "leave out `level`",
            source=source,
        )
    raise KvplanError("level", f"{level!r} is not a level of the run ({', '.join(levels)})", source=source)
