"""Driving a level of multi-turn sessions (kvplan.traffic.sessions): users who wait for each reply.

Closed loop (``concurrency: N``): N users, each running one session at a time: its turn 1 at once,
and turn k + 1 at turn k's finish + turn k + 1's think time; after a session's last turn the user
takes the next session at once. Open loop (``request_rates: r``): session i's turn 1 arrives at
the level's arrival offset i (the level's arrival process: r new sessions per second), its later
turns as in closed loop. A later turn's arrival_time is that scheduled arrival, so its TTFT counts
from it as an open-loop request's does. The level ends when every session is done::

    turn k finishes at f  ->  (f + think_s of turn k + 1, turn k + 1) joins the scheduled arrivals
                              (f: the end of the step that finished it, ``done_at``)
    loop: submit every scheduled arrival due by now; advance(the next one), or wait_until it when
          nothing is in flight

kvplan.run.driver.run_level runs a level here when its requests carry sessions, through the
backend protocol it uses for every level (now, submit, advance(until), wait_until).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kvplan.traffic.requests import SampledRequest


class SessionBackend(Protocol):
    """What the loop asks of kvplan.run.driver.Backend (submitting goes through ``send``)."""

    def now(self) -> float: ...

    def advance(self, until: float | None) -> tuple[list[Any], Sequence[Any]]: ...

    def wait_until(self, when: float) -> None: ...


def done_at(finished: Any, steps: Sequence[Any]) -> float:
    """When a turn counts as finished for its session: the end of the engine step that finished it
    (the last of the steps reported with it), or without steps (a remote target) its finish_time.

    The engine stamps a request's finish a moment before its step's end (its bookkeeping runs in
    between), and a simulation knows only step ends: timing the next turn from the step's end is
    what lets the simulator replay a session level step for step (kvplan.run.sim.replay)."""
    return steps[-1].end_time if steps else finished.finish_time


def run_sessions(
    backend: SessionBackend,
    requests: Sequence[SampledRequest],
    users: int | None,
    offsets: Callable[[int], float] | None,
    send: Callable[[int, float | None], str],
    record: Callable[[list[Any], Sequence[Any]], None],
) -> None:
    """Run every session of ``requests`` (a level's, each session's turns in order) to its end.

    users: the closed loop's N; None for open loop, whose ``offsets(i)`` is session i's first
        arrival, seconds after the level's start.
    send(index, arrival): submits ``requests[index]`` with that scheduled arrival (None: now) and
        returns its request id. record(finished, steps): the level's Recorder.record.
    """
    by_session: dict[int | None, list[int]] = {}
    for index, request in enumerate(requests):
        by_session.setdefault(request.session, []).append(index)
    sessions = list(by_session.values())
    due: list[tuple[float, int, int]] = []  # (scheduled arrival, session, turn position): a heap
    in_flight: dict[str, tuple[int, int]] = {}  # request id -> (session, turn position)
    untaken = iter(range(len(sessions)))  # closed loop: sessions no user has taken yet

    def go(session: int, turn: int, arrival: float | None) -> None:
        in_flight[send(sessions[session][turn], arrival)] = (session, turn)

    if users is None:
        assert offsets is not None  # open loop: the level's arrival offsets
        t0 = backend.now()
        due = [(t0 + offsets(s), s, 0) for s in range(len(sessions))]  # ascending, so already a heap
    else:
        for session in itertools.islice(untaken, users):
            go(session, 0, None)
    while True:
        now = backend.now()
        while due and due[0][0] <= now:
            at, session, turn = heapq.heappop(due)
            go(session, turn, at)
        next_arrival = due[0][0] if due else None
        if not in_flight:
            if next_arrival is None:
                return
            backend.wait_until(next_arrival)  # every user is thinking
            continue
        finished, steps = backend.advance(next_arrival)
        record(finished, steps)
        for out in finished:
            session, turn = in_flight.pop(out.request_id)
            if turn + 1 < len(sessions[session]):
                think_s = requests[sessions[session][turn + 1]].think_time_s
                heapq.heappush(due, (done_at(out, steps) + think_s, session, turn + 1))
            elif users is not None and (following := next(untaken, None)) is not None:
                go(following, 0, None)
