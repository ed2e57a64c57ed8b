"""``kvplan profile --replay``: a request log written as a Mooncake-format trace, and the workload
that replays it (``dataset: {kind: trace}``, kvplan.traffic.trace) instead of one that resembles it.

Each request becomes one trace line: ``timestamp`` (ms after the log's first arrival),
``input_length``, ``output_length`` and, where the log gives the prompt's token ids (an OpenAI log,
tokenised; a Mooncake trace, its blocks expanded), ``hash_ids``: one id per block of the prompt (a
Mooncake log's 512 tokens, else the profile's block size), the same id exactly where two prompts
have the same tokens up to and including that block (a hash chain, as the engine's prefix cache
keys its blocks), so the replay shares the blocks the log shared. A log without token ids (a
kvplan ``requests.jsonl``) gets no ``hash_ids``: every request then has blocks of its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.profile.log import ParsedLog

BLOCK_TOKENS = 512  # the Mooncake traces' block (github.com/kvcache-ai/Mooncake, FAST25-release/traces)


def trace_lines(parsed: ParsedLog, block_tokens: int = BLOCK_TOKENS) -> list[dict[str, Any]]:
    """The log's requests as Mooncake trace lines, in arrival order, one hash id per ``block_tokens``
    tokens (see the module docstring)."""
    first = parsed.requests[0].arrival_s
    chain: dict[tuple[int | None, tuple[int, ...]], int] = {}
    out = []
    for r in parsed.requests:
        row: dict[str, Any] = {
            "timestamp": round((r.arrival_s - first) * 1000, 3),
            "input_length": max(1, r.input_tokens),
            "output_length": max(1, r.output_tokens),
        }
        if r.token_ids is not None:
            ids, parent = [], None
            for start in range(0, len(r.token_ids), block_tokens):
                parent = chain.setdefault((parent, tuple(r.token_ids[start : start + block_tokens])), len(chain))
                ids.append(parent)
            row["hash_ids"] = ids
        out.append(row)
    return out


def replay_workload(parsed: ParsedLog, out: str | Path, *, model: str, name: str, block_size: int) -> dict[str, Any]:
    """Write the trace beside ``out`` (``<out stem>.trace.jsonl``) and return the workload that
    replays it: one trace bucket on ``model`` with prefix caching on. A Mooncake log keeps its
    512-token blocks; any other log is cut into the profile's ``block_size`` (the engine's), so
    prompts sharing less than 512 tokens still share their full blocks.

    Raises:
        KvplanError: the trace file cannot be written.
    """
    path = Path(out).with_suffix(".trace.jsonl")
    mooncake = all(r.fmt == "mooncake" for r in parsed.requests)
    block_tokens = BLOCK_TOKENS if mooncake else block_size
    text = "".join(json.dumps(row) + "\n" for row in trace_lines(parsed, block_tokens))
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise KvplanError("out", f"cannot write {path} ({err.strerror or err})") from None
    return {
        "name": name,
        "seed": 0,
        "engine": {"model": model, "enable_prefix_caching": True},
        "dataset": {"kind": "trace", "path": path.name, "block_tokens": block_tokens},
        "buckets": [{"name": "trace"}],
    }
