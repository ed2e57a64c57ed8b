"""What a remote server said about itself during a target run: its ``/metrics`` read every few
milliseconds, one ``ServerSample`` per read (``server_metrics.jsonl``), and the per-level
server-side numbers computed from them.

A sample holds the values kvplan reads (kvplan.run.server.server_metrics maps vLLM's and
SGLang's names onto these fields); a metric the server does not expose is None, never 0. The
scraper reads once more at each level's first submission and after its last finish
(``boundary`` True), so a counter's difference across a level is exact::

    server preemptions of a level = preemptions_total(last sample) - preemptions_total(first)
    server peak KV usage          = max kv_usage over the level's samples (0..1)

A steady-state level (kvplan.results.stats.steady: a warm-up, a cool-down, a protocol's drained
warm-up) counts the server's numbers over its measured window only, as its client-side numbers:
the counters from the last read at or before the window's start to the first read at or after its
end (so no event of the window is missed; one scrape interval, a few ms, may add events at each
edge), KV usage over the reads inside the window (the bracketing reads where none falls inside).
A peak that lasts less than one scrape interval can fall between two reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvplan.results.records import LevelKey

SERVER_METRICS_FILE = "server_metrics.jsonl"


@dataclass(frozen=True)
class ServerSample:
    """One read of the server's /metrics during a level (times on the run's clock, seconds).
    ``kv_usage``: used / total KV (0..1); counters are totals since the server started."""

    time: float
    bucket: str
    mode: str
    level: int | float
    variant: str = ""
    boundary: bool = False
    kv_usage: float | None = None
    num_running: float | None = None
    num_waiting: float | None = None
    preemptions_total: float | None = None
    prefix_queries_total: float | None = None
    prefix_hits_total: float | None = None
    error: str = ""  # why this read failed ("" when it did not); its values are all None then
    kv_tokens: float | None = None  # tokens held in the KV cache (llama.cpp's, where it says)
    prompt_tokens_total: float | None = None  # prompt tokens the server processed (counter)
    generation_tokens_total: float | None = None  # tokens it generated (counter)

    @property
    def key(self) -> LevelKey:
        return LevelKey.of(self)


@dataclass(frozen=True)
class ServerLevelStats:
    """One level's server-side numbers (None: not exposed, or no read in the level)."""

    preemptions: int | None
    peak_kv_usage: float | None
    mean_kv_usage: float | None
    prefix_hit_rate: float | None
    num_samples: int
    generation_tokens: int | None = None  # the server's generated-token counter across the level


def _delta(samples: Sequence[ServerSample], field: str) -> float | None:
    values = [getattr(s, field) for s in samples if getattr(s, field) is not None]
    return values[-1] - values[0] if values else None


def in_window(own: Sequence[ServerSample], window: tuple[float, float]) -> list[ServerSample]:
    """The reads of one level (time order) that count for a measured ``window`` (start, end on the
    run's clock, seconds): the last at or before the start, those inside, the first at or after
    the end (module docstring). All of them when no read precedes the start or follows the end."""
    start, end = window
    before = [i for i, s in enumerate(own) if s.time <= start]
    after = [i for i, s in enumerate(own) if s.time >= end]
    first = before[-1] if before else 0
    last = after[0] if after else len(own) - 1
    return list(own[first : last + 1])


def level_server_stats(
    samples: Sequence[ServerSample], windows: Mapping[LevelKey, tuple[float, float]] | None = None
) -> dict[LevelKey, ServerLevelStats]:
    """Per level, from its samples in time order (see the module docstring); ``windows``: a
    steady-state level's measured window (start, end on the run's clock, s), whose reads alone
    count (``in_window``)."""
    by_key: dict[LevelKey, list[ServerSample]] = {}
    for s in samples:
        by_key.setdefault(s.key, []).append(s)
    out = {}
    for key, own in by_key.items():
        own.sort(key=lambda s: s.time)
        if windows and key in windows:
            own = in_window(own, windows[key])
        usage = [s.kv_usage for s in own if s.kv_usage is not None]
        preempted = _delta(own, "preemptions_total")
        queries, hits = _delta(own, "prefix_queries_total"), _delta(own, "prefix_hits_total")
        generated = _delta(own, "generation_tokens_total")
        out[key] = ServerLevelStats(
            preemptions=None if preempted is None else int(round(preempted)),
            peak_kv_usage=max(usage) if usage else None,
            mean_kv_usage=sum(usage) / len(usage) if usage else None,
            prefix_hit_rate=hits / queries if queries and hits is not None else None,
            num_samples=sum(not s.error for s in own),
            generation_tokens=None if generated is None else int(round(generated)),
        )
    return out
