"""What a step costs: the work a step runs, and the clocks a simulation takes step times from.

A simulated step's work is ``StepWork`` (read off the engine's ``SchedulerOutput``, or off a
recorded ``StepRecord`` when fitting); a ``CostModel`` turns it into seconds. The simulation's
clock asks a ``StepClock`` when the next step starts and ends::

    previous step ends at t  --(gap: the driver's own work between steps)-->  next step starts
    start --(CostModel.step_seconds(work))--> end: the step's tokens reach their clients

A server's front end (HTTP, input processing, the hand-off to its engine loop, the stream back)
is no step: a clock's ``submit_lag_s`` is the seconds a request takes from its client's send to
the server's scheduler (and its tokens back), 0 for the bundled engine stepped in process. A
server that tokenizes text prompts on one thread adds a queue before that: a clock's
``front_end`` (``TextFrontEnd``; None for the bundled engine, which is sent token ids).

``ModelClock`` is that clock for any cost model (the calibrated one, the GPU roofline);
``kvplan.run.sim.replay.ReplayClock`` replays a measured run's own step times instead. A server's
steps seen from its client scatter about the fitted model (its own stalls, its processes sharing
the CPU): ``StepJitter`` adds to each step a residual drawn from the ones measured, so that
latencies made of one or two steps (TTFT) see a typical step and those averaged over many (TPOT)
the mean one, as on the server.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from engine.frozen import fast_init


@fast_init  # built once a step or request (engine.frozen)
@dataclass(frozen=True)
class StepWork:
    """The work of one engine step (engine.outputs.SchedulerOutput's counts):
    ``num_prefill_tokens`` (prompt chunks and recomputes), ``num_decode_tokens`` (= decoding
    requests, one token each), ``num_prefill_seqs`` (requests with prefill tokens),
    ``num_context_tokens`` (sum of scheduled requests' cached + new tokens: the K/V attention
    reads), ``num_attended_tokens`` (causal query-key pairs per head) and
    ``num_decode_context_tokens`` (the decoding requests' share of ``num_context_tokens``; 0 where
    a record predates it); with KV offload tiers, ``num_host_loads`` and ``num_disk_loads``: the
    blocks the step loads back from each lower tier (engine.offload; priced by a clock's links)."""

    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_seqs: int
    num_context_tokens: int
    num_attended_tokens: int
    num_decode_context_tokens: int = 0
    num_host_loads: int = 0
    num_disk_loads: int = 0

    @classmethod
    def of(cls, step: Any) -> StepWork:
        """From anything with these fields (a SchedulerOutput, StepStats or StepRecord; the last
        one optional)."""
        return cls(
            step.num_prefill_tokens,
            step.num_decode_tokens,
            step.num_prefill_seqs,
            step.num_context_tokens,
            step.num_attended_tokens,
            getattr(step, "num_decode_context_tokens", 0),
        )

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


def decode_work(num_decodes: int, num_context_tokens: int) -> StepWork:
    """A decode-only step's work: each decode attends to its own context (engine.decode_run)."""
    return StepWork(0, num_decodes, 0, num_context_tokens, num_context_tokens, num_context_tokens)


def decode_seconds(cost: Any, num_decodes: int, contexts: np.ndarray) -> np.ndarray:
    """``cost.step_seconds`` of decode-only steps of ``num_decodes`` decodes over each of
    ``contexts`` context tokens (int64 [k]): seconds [k], float for float what ``step_seconds``
    gives each ``decode_work``; in one call where the cost model has ``decode_seconds`` (the same
    arithmetic over the array), else step by step."""
    fast = getattr(cost, "decode_seconds", None)
    if fast is not None:
        return np.asarray(fast(num_decodes, contexts), dtype=np.float64)
    return np.array([cost.step_seconds(decode_work(num_decodes, c)) for c in contexts.tolist()], dtype=np.float64)


class CostModel(Protocol):
    """Seconds a step of ``work`` takes (``step_seconds``), and ``gap_s``: seconds between one
    step's end and the next one's start (the serving loop's own work)."""

    @property
    def gap_s(self) -> float: ...  # read only: the cost models are frozen dataclasses

    def step_seconds(self, work: StepWork) -> float: ...


class StepClock(Protocol):
    """Where a simulation's steps sit on its virtual clock (seconds), and ``submit_lag_s``: the
    seconds from a request's arrival to its scheduler's waiting queue (the module docstring)."""

    @property
    def submit_lag_s(self) -> float: ...

    def begin_level(self, level_id: str, now: float) -> None:
        """A level (``LevelKey.id``) starts at ``now``: its first request was just submitted."""

    def next_start(self, now: float) -> tuple[float, float]:
        """For the step after ``now``: (the time up to which arrivals join it, its start)."""

    def step_end(self, start: float, work: StepWork) -> float:
        """When a step of ``work`` that started at ``start`` ends."""


@dataclass(frozen=True)
class StepJitter:
    """The measured steps' residuals about a fitted model, s: ``quantiles``, the 0th to 100th
    percentile (101 values, ascending; kvplan.run.sim.calibration.client_steps.step_jitter). A
    clock draws one per step by inverse transform sampling (a uniform u in [0, 1), linear between
    neighbouring percentiles), from a stream seeded by the level's id alone, so a level's draws
    are the same in every run and whichever probes ran before it."""

    quantiles: tuple[float, ...]

    def stream(self, level_id: str) -> random.Random:
        """The level's own random stream (seeded by the CRC-32 of its id)."""
        return random.Random(zlib.crc32(level_id.encode()))

    def draw(self, rng: random.Random) -> float:
        """One residual, s."""
        q = self.quantiles
        x = rng.random() * (len(q) - 1)
        i = int(x)
        return q[i] + (x - i) * (q[i + 1] - q[i])


# vLLM's API server tokenizes every text prompt on one thread (AsyncMicrobatchTokenizer,
# vllm/utils/async_utils.py, vllm PR #19334: max_batch_size 32, batch_wait_timeout_s 0.002; vllm
# issue #25301: the cost is linear in the prompt and serialized under load). The rate: transformers'
# tokenizer call one prompt at a time on the o200k vocabulary (gpt-oss), 3.1-3.5 us per prompt token
# on prompts drawn as the random dataset draws them, timed on a 2-CPU Xeon VM on 2026-12-06
# (docs/benchmarks.md#silicon-check); the serving host's own is unknown.
VLLM_TOKENIZE_US_PER_TOKEN = 3.3
VLLM_TOKENIZE_WINDOW_S = 0.002
VLLM_TOKENIZE_MAX_BATCH = 32


@dataclass(frozen=True)
class TextFrontEnd:
    """A server's one tokenizer thread before its scheduler's queue, as vLLM's
    ``AsyncMicrobatchTokenizer`` runs it: the thread, free at ``free``, takes the first prompt
    waiting (arrived at ``a_1``) at ``t0 = max(free, a_1)``, gathers the next ones in arrival order
    that arrive by ``t0 + window_s``, at most ``max_batch`` in all, and encodes them in one call::

        closes   at the max_batch-th one's arrival (not before t0) when it fills, else at t0 + window_s
        leaves   close + s_per_token x (the batch's prompt tokens): every prompt of the batch together

    The encode call costs its tokens one after another (a host whose tokenizer splits a batch over
    cores is faster). ``s_per_token`` >= 0, s per prompt token; ``window_s`` >= 0;
    ``max_batch`` >= 1."""

    s_per_token: float
    window_s: float = VLLM_TOKENIZE_WINDOW_S
    max_batch: int = VLLM_TOKENIZE_MAX_BATCH

    def next_batch(
        self, free_s: float, waiting: Iterable[tuple[float, int]], horizon_s: float
    ) -> tuple[int, float] | None:
        """The thread's next call over ``waiting`` ((arrival s, prompt tokens) in arrival order, at
        least one): (how many of the first ones it encodes, when they leave it, s); None while a
        prompt not yet known could still join it (every arrival up to ``horizon_s`` is known)."""
        waiting = iter(waiting)
        first, tokens = next(waiting)
        t0 = max(free_s, first)
        deadline = t0 + self.window_s
        count, last, later = 1, first, False
        for arrival, num_tokens in waiting:
            if count == self.max_batch:
                break
            if arrival > deadline:
                later = True  # one arrived after the deadline: nobody else can join
                break
            count, tokens, last = count + 1, tokens + num_tokens, arrival
        if count == self.max_batch:
            close = max(t0, last)
        elif later or deadline <= horizon_s:
            close = deadline
        else:
            return None
        return count, close + tokens * self.s_per_token


class ModelClock:
    """A ``StepClock`` from a cost model: each step starts ``gap_s`` after the previous one ended
    (arrivals until then join it) and lasts ``step_seconds(work)``; requests reach the scheduler
    ``submit_lag_s`` after they arrive (>= 0; a server's front end, fitted by
    kvplan.run.sim.calibration.client_steps.front_end_seconds). With ``links``
    (kvplan.sizing.gpus.offload.TierLinks), a step that loads blocks back from offload tiers lasts
    their ``load_seconds`` longer: the loads are on its critical path (stores are not). With
    ``jitter`` (a server's calibration), each step lasts its model's seconds plus a drawn residual,
    at least 0, drawn once per step taken in the order the steps are taken. With ``front_end``
    (``TextFrontEnd``), each request first queues for the server's tokenizer thread."""

    def __init__(
        self,
        cost: CostModel,
        submit_lag_s: float = 0.0,
        links: Any = None,
        jitter: StepJitter | None = None,
        front_end: TextFrontEnd | None = None,
    ):
        self.cost = cost
        self.submit_lag_s = submit_lag_s
        self.front_end = front_end
        self.links = links
        self.jitter = jitter
        self._rng: random.Random | None = None

    def begin_level(self, level_id: str, now: float) -> None:
        if self.jitter is not None:
            self._rng = self.jitter.stream(level_id)

    def next_start(self, now: float) -> tuple[float, float]:
        start = now + self.cost.gap_s
        return start, start

    def step_end(self, start: float, work: StepWork) -> float:
        seconds = self.cost.step_seconds(work)
        if self.jitter is not None:
            if self._rng is None:
                self._rng = self.jitter.stream("")
            seconds = max(seconds + self.jitter.draw(self._rng), 0.0)
        end = start + seconds
        if self.links is not None and (work.num_host_loads or work.num_disk_loads):
            end += self.links.load_seconds(work.num_host_loads, work.num_disk_loads)
        return end

    def decode_times(
        self, now: float, num_decodes: int, context0: int, num_steps: int
    ) -> tuple[list[float], list[float], list[float]] | None:
        """The (checks, starts, ends) of ``num_steps`` decode-only steps after ``now``, step j of
        ``num_decodes`` decodes over ``context0 + num_decodes x j`` context tokens
        (engine.decode_run): float for float what ``next_start`` and ``step_end`` give step by
        step, the same additions in the same order (start = previous end + gap, end = start +
        seconds: one running sum over gap, seconds, gap, ... that numpy's accumulate adds in
        order); a decode step loads nothing back, so the links add nothing. None with ``jitter``:
        its draws follow the steps actually taken, so the run asks step by step."""
        if self.jitter is not None:
            return None
        contexts = context0 + num_decodes * np.arange(num_steps, dtype=np.int64)
        sums = np.empty(2 * num_steps + 1, dtype=np.float64)
        sums[0], sums[1::2], sums[2::2] = now, self.cost.gap_s, decode_seconds(self.cost, num_decodes, contexts)
        np.add.accumulate(sums, out=sums)
        starts = sums[1::2].tolist()
        return starts, starts, sums[2::2].tolist()


class FixedStepCost:
    """Every step takes ``seconds``, with no gap: for searches that need no timing (the knee: closed-
    loop admission and preemption depend on token counts and free blocks only)."""

    gap_s = 0.0

    def __init__(self, seconds: float = 1e-3):
        self.seconds = seconds

    def step_seconds(self, work: StepWork) -> float:
        return self.seconds

    def decode_seconds(self, n: int, contexts: np.ndarray) -> np.ndarray:
        """``seconds`` for each of the decode steps over ``contexts`` (engine.decode_run)."""
        return np.full(len(contexts), self.seconds, dtype=np.float64)
