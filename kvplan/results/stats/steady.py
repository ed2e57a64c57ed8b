"""Steady-state levels: which of a level's requests are measured, and the window they span.

A bucket's levels may run for a time (``duration_s``) instead of a count, and keep a warm-up and
a cool-down out of every statistic, as GuideLLM, AIPerf and ``vllm bench serve`` do. The driver
sends the requests; this module decides afterwards, from the records alone, which were measured,
so that ``kvplan report`` recomputes the same answer from the same files::

    sent:      | warm-up |           measured            | cool-down |   (then the drain)
    index:     0 ...  w-1  w ...                      w+n-1 ...          (count-based level)
    arrival:   t0 ... t0+warmup_s ...      t_send_end-cooldown_s ... t_send_end

A request is measured when its index is past the warm-up count and before the cool-down count,
and it arrived after ``t0 + warmup_s`` and before ``t_send_end - cooldown_s``. ``t0`` is the
level's first arrival; ``t_send_end`` is ``t0 + duration_s`` for a timed level, else the last
arrival. The index is the driver's, the last part of the request id (``<level id>/<index>``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from kvplan.results.records import RequestRecord, StepRecord
from kvplan.results.stats.step_log import StepLog


class LevelSchedule(BaseModel):
    """How each level of one bucket runs: ``num_requests`` measured requests (or for
    ``duration_s`` seconds), after ``warmup_requests`` and before ``cooldown_requests`` more, and
    with the requests that arrive in the first ``warmup_s`` or the last ``cooldown_s`` seconds of
    sending kept out of the statistics. ``warmup_drained``: the warm-up requests all finish before
    a measured one is sent (a benchmark client's warm-up, kvplan.workload.protocol), and with
    ``warmup_copies`` (the vLLM clients) they are copies of the level's first request, without it
    (AIPerf) the bucket's first requests; ``per_concurrency``: the request counts are per unit of
    each level's concurrency (``at`` gives a level's own); ``client``: the benchmark client whose
    protocol the levels follow where its counts are the same at every level (aiperf, guidellm),
    so that the report gives each latency's mean beside its percentiles. The last two fields came
    later with defaults, so older results read back unchanged."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_requests: int
    duration_s: float | None = None
    warmup_requests: int = 0
    warmup_s: float = 0.0
    cooldown_requests: int = 0
    cooldown_s: float = 0.0
    warmup_drained: bool = False
    per_concurrency: bool = False
    warmup_copies: bool = True
    client: str | None = None

    @property
    def is_plain(self) -> bool:
        """A level of ``num_requests`` requests with nothing excluded (every level before
        steady-state levels existed)."""
        return self.duration_s is None and not (
            self.warmup_requests
            or self.warmup_s
            or self.cooldown_requests
            or self.cooldown_s
            or self.warmup_drained
            or self.per_concurrency
            or self.client is not None
        )

    def at(self, concurrency: float) -> LevelSchedule:
        """The schedule of the level at ``concurrency``: this one, or for counts per unit of
        concurrency those counts x ``concurrency``."""
        if not self.per_concurrency:
            return self
        c = int(concurrency)
        return self.model_copy(
            update={
                "num_requests": self.num_requests * c,
                "warmup_requests": self.warmup_requests * c,
                "cooldown_requests": self.cooldown_requests * c,
                "per_concurrency": False,
            }
        )

    @property
    def total_requests(self) -> int | None:
        """Requests a count-based level sends (warm-up, measured, cool-down); None for a timed one."""
        if self.duration_s is not None:
            return None
        return self.warmup_requests + self.num_requests + self.cooldown_requests

    def split(self, requests: Sequence[RequestRecord]) -> tuple[list[RequestRecord], int, tuple[float, float] | None]:
        """(measured requests, how many were excluded, the measured window) of one level's
        requests. The window is (first measured arrival, last measured finish) in seconds from the
        level's first arrival; None when nothing was measured."""
        if not requests:
            return [], 0, None
        t0 = min(r.arrival_time for r in requests)
        send_end = t0 + self.duration_s if self.duration_s is not None else max(r.arrival_time for r in requests)
        sent = self.total_requests
        if sent is None:  # a timed level: every request sent was recorded (they drain)
            sent = max(request_index(r) for r in requests) + 1
        first, last = self.warmup_requests, sent - self.cooldown_requests
        start, end = t0 + self.warmup_s, send_end - self.cooldown_s
        measured = [r for r in requests if first <= request_index(r) < last and start <= r.arrival_time <= end]
        if not measured:
            return [], len(requests), None
        window = (
            min(r.arrival_time for r in measured) - t0,
            max(r.finish_time for r in measured) - t0,
        )
        return measured, len(requests) - len(measured), window


def request_index(record: RequestRecord) -> int:
    """The driver's index of a request within its level (the last part of its id)."""
    return int(record.request_id.rsplit("/", 1)[1])


def window_steps(steps: Sequence[StepRecord] | StepLog, t0: float, window: tuple[float, float]) -> Any:
    """The steps that ran within ``window`` (seconds from ``t0``): those ending after its start
    and starting before its end (a list; of a simulated probe's ``StepLog``, its StepColumns)."""
    start, end = t0 + window[0], t0 + window[1]
    if isinstance(steps, StepLog):
        return steps.columns().within(start, end)
    return [s for s in steps if s.end_time > start and s.start_time < end]
