"""Engine steps read back from a server run's client-side token times, for a step-time fit where
the server exports no step time (vLLM 0.32 exports none; docs/target.md).

A continuous-batching server runs steps one after another, and every request it runs in a step
gets its next token at the step's end: each running request one decode token, each request whose
prompt finished prefilling its first. Streamed to the client, the tokens of one step arrive
together, and those of the next step one step later. So, per level:

    events     every output token of every request: (arrival s, request, index), sorted by time
    steps      events closer than ``split`` to the previous one belong to the same step, where
               ``split`` = SPLIT_FRACTION x the level's median inter-token latency (a request's
               consecutive tokens lie one step apart, a step's own tokens a network jitter apart)
    work       per step: a request's token 0 -> a prefill of its prompt (less the cached tokens
               the server reported), context = its prompt; token i > 0 -> one decode token,
               context = prompt + i (kvplan.run.sim.cost.StepWork's counts)
    seconds    this step's tokens' first arrival - the previous step's, kept only where every
               request of the step had reached the server (sent + ``lag``, the front end below)
               before the previous step ended (else the server sat idle or the step waited for a
               request to arrive, and its length is not the step's)

What the client cannot see: a prompt prefilled in chunks over several steps (only the last chunk
ends in a token; chat prompts under the token budget are prefilled whole), a preempted request's
recompute (its next token looks like a decode), and a step whose requests all left without a
token. A step's seconds include the server's own gap between steps, so the fit's gap is 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from statistics import median

import numpy as np

from kvplan.results.records import RequestRecord
from kvplan.run.sim.calibration.fit import LinearStepCost, StepSample
from kvplan.run.sim.cost import StepWork

SPLIT_FRACTION = 0.3  # of the median inter-token latency: tokens closer than this share a step
MIN_SPLIT_S = 2e-4  # the floor, seconds: tokens closer than 0.2 ms always share a step


def _prefill(prompt: int, cached: int) -> StepWork:
    """A whole prompt of ``prompt`` tokens, ``cached`` of them found cached (engine/outputs.py's
    counts: n new tokens after c cached attend n x c + n x (n + 1) / 2 query-key pairs)."""
    cached = min(cached, prompt - 1)
    n = prompt - cached
    return StepWork(n, 0, 1, prompt, n * cached + n * (n + 1) // 2, 0)


def _decode(context: int) -> StepWork:
    """One decode token whose request then holds ``context`` tokens."""
    return StepWork(0, 1, 0, context, context, context)


def _sum(works: Sequence[StepWork]) -> StepWork:
    return StepWork(*(sum(getattr(w, f) for w in works) for f in StepWork.__dataclass_fields__))


def client_samples(requests: Sequence[RequestRecord], lag: float = 0.0) -> list[StepSample]:
    """The steps of every level of ``requests`` (a ``--target`` run's records), in level order,
    each with the work it ran and its seconds (module docstring); gap None (included). ``lag``:
    the server's front-end latency, s (``front_end_seconds``).

    Shapes: one StepSample per step kept; a level with fewer than two tokens gives none.
    """
    return [sample for _, sample in client_steps(requests, lag)]


def client_steps(requests: Sequence[RequestRecord], lag: float = 0.0) -> list[tuple[float, StepSample]]:
    """``client_samples`` with each step's end: the client-side arrival of its first token, s."""
    by_level: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in requests:
        by_level[r.key.name].append(r)
    out: list[tuple[float, StepSample]] = []
    for level, records in by_level.items():
        out.extend(_level_steps(level, records, lag))
    return out


def _level_steps(level: str, records: Sequence[RequestRecord], lag: float) -> list[tuple[float, StepSample]]:
    itl = [b - a for r in records for a, b in zip(r.token_times, r.token_times[1:])]
    if not itl:
        return []
    split = max(SPLIT_FRACTION * median(itl), MIN_SPLIT_S)
    events = sorted((t, i, n) for n, r in enumerate(records) for i, t in enumerate(r.token_times))
    steps: list[list[tuple[float, int, int]]] = []
    for event in events:
        if steps and event[0] - steps[-1][-1][0] < split:
            steps[-1].append(event)
        else:
            steps.append([event])
    out = []
    for previous, step in zip(steps, steps[1:]):
        before = previous[0][0]
        works = []
        for _, index, n in step:
            r = records[n]
            if index == 0:
                sent = r.sent_time if r.sent_time is not None else r.arrival_time
                if sent + lag > before:
                    break  # the step may have waited for this request: its start is unknown
                works.append(_prefill(r.num_prompt_tokens, r.num_cached_tokens))
            else:
                works.append(_decode(r.num_prompt_tokens + index))
        else:
            out.append((step[0][0], StepSample(level, _sum(works), step[0][0] - before, None)))
    return out


def step_jitter(samples: Sequence[StepSample], model: LinearStepCost) -> tuple[float, ...]:
    """The residuals of ``samples`` about ``model`` (measured seconds - the model's), s, as their
    0th to 100th percentiles (numpy's linear interpolation; 101 values, ascending): the scatter of a
    server's steps that a fit of their mean leaves out (kvplan.run.sim.cost.StepJitter).

    Raises:
        ValueError: no samples.
    """
    if not samples:
        raise ValueError("no steps to read the jitter from")
    residuals = [s.seconds - model.step_seconds(s.work) for s in samples]
    return tuple(float(v) for v in np.percentile(residuals, np.arange(101)))


def front_end_seconds(
    requests: Sequence[RequestRecord], model: LinearStepCost, jitter: Sequence[float] | None = None
) -> float:
    """The server's front-end latency, s (module docstring): the median over the requests that
    were alone on the server from their send to their first token (no other request of their level
    in flight) of TTFT - ``model``'s seconds for a step prefilling their prompt alone, less the
    median residual of ``jitter`` (``step_jitter``'s percentiles: such a step took the model's
    seconds plus a residual, and the median of a constant plus a residual is the constant plus the
    residual's median); 0 where no request was alone or that is negative."""
    by_level: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in requests:
        if r.token_times:
            by_level[r.key.name].append(r)
    lags = []
    for records in by_level.values():
        sent = [r.sent_time if r.sent_time is not None else r.arrival_time for r in records]
        order = sorted(range(len(records)), key=sent.__getitem__)
        busy_until = float("-inf")  # the last token of every request sent before this one
        for k, i in enumerate(order):
            r = records[i]
            first = r.token_times[0]
            next_sent = sent[order[k + 1]] if k + 1 < len(order) else float("inf")
            if busy_until <= sent[i] and next_sent >= first:
                lags.append(first - sent[i] - model.step_seconds(_prefill(r.num_prompt_tokens, r.num_cached_tokens)))
            busy_until = max(busy_until, r.token_times[-1])
    typical = jitter[len(jitter) // 2] if jitter else 0.0
    return max(median(lags) - typical, 0.0) if lags else 0.0
