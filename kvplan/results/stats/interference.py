"""Interference in a mixed level: each request class mixed with the others against alone.

A mix bucket run with interference (kvplan.run.driver._alone; ``kvplan simulate`` always) follows
every mixed level with each class alone, on the same requests of that class, at its share of the
load. Setting the class's tail latency in the two side by side shows what the mix costs it: a
long prompt's prefill in the same batch delays every short request's next token::

    amplification = P99 mixed / P99 alone      (TTFT and TPOT, ms; > 1: the mix slows the class)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvplan.results.metrics import LevelSummary
from kvplan.results.stats.variants import alone_variant


@dataclass(frozen=True)
class ClassInterference:
    """One class of one mixed level: its P99 TTFT and TPOT (ms) mixed and alone (None where the
    class had no such latency)."""

    bucket: str
    mode: str
    level: int | float
    variant: str  # the mixed level's variant ("" or an engine variant)
    request_class: str
    ttft_p99_ms_mixed: float | None
    ttft_p99_ms_alone: float | None
    tpot_p99_ms_mixed: float | None
    tpot_p99_ms_alone: float | None

    @staticmethod
    def ratio(mixed: float | None, alone: float | None) -> float | None:
        """mixed / alone, None where either is missing or alone is 0."""
        return mixed / alone if mixed is not None and alone else None


def interference(levels: Sequence[LevelSummary]) -> list[ClassInterference]:
    """Per mixed level with its classes run alone, per class: mixed against alone (see the module)."""
    by_key = {lv.key: lv for lv in levels}
    rows = []
    for lv in levels:
        for c in lv.classes:
            alone_key = type(lv.key)(lv.bucket, lv.key.mode, lv.level, alone_variant(lv.variant, c.name))
            alone = by_key.get(alone_key)
            if alone is None:
                continue
            p99 = lambda stats: None if stats is None else stats.p99  # noqa: E731
            rows.append(
                ClassInterference(
                    bucket=lv.bucket,
                    mode=lv.mode,
                    level=lv.level,
                    variant=lv.variant,
                    request_class=c.name,
                    ttft_p99_ms_mixed=p99(c.ttft_ms),
                    ttft_p99_ms_alone=p99(alone.ttft_ms),
                    tpot_p99_ms_mixed=p99(c.tpot_ms),
                    tpot_p99_ms_alone=p99(alone.tpot_ms),
                )
            )
    return rows
