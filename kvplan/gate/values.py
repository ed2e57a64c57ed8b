"""The values a gate checks, read from a run result: one per metric and scope.

A scope is the whole run (``(run)``), a bucket (``short``) or a load level of a bucket
(``short c=8``, ``short 2 req/s``, ``short c=8 cached``: kvplan.results.records.LevelKey's
label). These labels are the keys of a baseline file's ``values:``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.errors import KvplanError
from kvplan.results.gated import METRICS
from kvplan.results.metrics import LevelSummary, preemptions
from kvplan.results.run_result import RunResult

RUN_SCOPE = "(run)"  # bucket names cannot hold parentheses, so this never clashes with one


@dataclass(frozen=True)
class CheckKey:
    """Where a value belongs: ``bucket`` is empty for run metrics, ``level`` (``c=8``,
    ``2 req/s``, ``c=8 cached``) empty for run and bucket metrics."""

    metric: str
    bucket: str = ""
    level: str = ""

    @property
    def scope_label(self) -> str:
        """``(run)``, ``short`` or ``short c=8``: the baseline file's key for this scope."""
        return " ".join(p for p in (self.bucket, self.level) if p) or RUN_SCOPE


def _field(value: Any, dotted: str) -> float | None:
    """``ttft_ms.p95`` of a summary: attribute by attribute, None where a part is missing."""
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
    return value


def _run_facts(result: RunResult) -> Any:
    """What the run metrics read: the engine's facts, or for a remote target its KV pool in
    tokens as the server exposes it (its bytes per token are not exposed: None)."""
    server = result.server
    if result.engine is not None or server is None:
        return result.engine
    tokens = server.pool_tokens or (
        server.num_gpu_blocks * server.block_size if server.num_gpu_blocks and server.block_size else None
    )
    return {"pool_tokens": tokens}


def _level_value(level: LevelSummary, field: str) -> float | None:
    """A level metric; a target's levels have no engine steps, so their preemptions are the
    server's and their block counts unknown."""
    if level.num_steps == 0 and field == "num_preemptions":
        return preemptions(level)
    if level.num_steps == 0 and field == "peak_used_blocks":
        return None
    return _field(level, field)


def read_values(result: RunResult, where: str = "results.json") -> dict[CheckKey, float | None]:
    """Every metric of every scope of a run result, in table order: run metrics, then per bucket
    its own metrics followed by each of its levels'.

    Raises:
        KvplanError: two levels of one bucket with the same label (no single value), naming ``where``.
    """
    values: dict[CheckKey, float | None] = {}
    for m in METRICS:
        if m.scope == "run":
            values[CheckKey(m.name)] = _field(_run_facts(result), m.field)
    for bucket in result.buckets:
        for m in METRICS:
            if m.scope == "bucket":
                values[CheckKey(m.name, bucket.name)] = _field(bucket, m.field)
        labels: set[str] = set()
        for level in (lv for lv in result.levels if lv.bucket == bucket.name):
            label = level.key.label
            if label in labels:
                raise KvplanError("levels", f"bucket {bucket.name!r} has two levels labelled {label!r}", source=where)
            labels.add(label)
            for m in METRICS:
                if m.scope == "level":
                    values[CheckKey(m.name, bucket.name, label)] = _level_value(level, m.field)
    return values
