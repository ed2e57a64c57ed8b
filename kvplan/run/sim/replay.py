"""A measured run's own step times as a simulation's clock: the exactness check of the simulator.

With ``ReplayClock`` every simulated step k of a level starts and ends when the measured step k
did (shifted to the simulation's clock), so open-loop arrivals meet the scheduler at the same
steps as they did on the engine, and any difference between the two runs is the scheduler
replay's, not the cost model's. Closed-loop levels never depend on the clock.

Which arrivals joined step k? On the engine the driver read its clock once between step k-1's
end and step k's start and submitted every request that had arrived by then. That reading lies
at or after ``check_k``, the later of step k-1's end and the latest arrival among the requests
submitted in that gap (each record's ``submit_time``; in runs recorded before it existed, those
first scheduled in step k, which were submitted before it), and before any arrival that was not
submitted (those arrived after the reading)::

    measured:  end(k-1) ... a_i (submitted before k) ... driver reads clock ... start(k) ... a_j
    replay:    arrivals <= check_k join step k; later ones wait for step k+1

A request submitted in that gap but not admitted at step k still joins the waiting queue before
step k, in the same place as on the engine: without its submit time the replay deferred it past
requests submitted at step k's end, and a multi-turn level with think times of milliseconds could
then admit turns in another order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence

from kvplan.results.records import RequestRecord, StepRecord
from kvplan.run.driver import RunStopped
from kvplan.run.sim.cost import StepWork

_EPSILON_S = 1e-9  # float rounding of the shift between the two clocks, far below perf_counter's steps


class ReplayClock:
    """A ``StepClock`` (kvplan.run.sim.cost) replaying ``steps`` level by level.

    Raises (from ``next_start`` and ``step_end``):
        RunStopped: the simulation ran more steps in a level than the measured run did (the workload
            is not the one the run measured): the run stops there, keeping what finished.
    """

    submit_lag_s = 0.0  # the bundled engine, stepped in process: no front end

    def __init__(self, steps: Sequence[StepRecord], requests: Sequence[RequestRecord]):
        self._steps: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for s in steps:
            self._steps[s.key.id].append((s.start_time, s.end_time))
        self._t0: dict[str, float] = {}
        self._joined: dict[tuple[str, float], float] = {}  # (level, step start) -> latest arrival first scheduled there
        starts = {level: [start for start, _ in steps] for level, steps in self._steps.items()}
        for r in requests:
            level = r.key.id
            self._t0[level] = min(self._t0.get(level, r.arrival_time), r.arrival_time)
            joined = [r.first_scheduled_time]  # submitted before the step that first scheduled it
            if r.submit_time is not None:  # ... and before the first step that started after its submission
                k = bisect_right(starts.get(level, []), r.submit_time)
                joined.append(starts[level][k] if k < len(starts.get(level, [])) else None)
            for start in joined:
                if start is not None:
                    at = (level, start)
                    self._joined[at] = max(self._joined.get(at, r.arrival_time), r.arrival_time)
        self._level, self._k, self._shift = "", 0, 0.0

    def begin_level(self, level_id: str, now: float) -> None:
        self._level, self._k = level_id, 0
        self._shift = now - self._t0.get(level_id, now)

    def _measured(self) -> list[tuple[float, float]]:
        steps = self._steps.get(self._level, [])
        if self._k >= len(steps):
            raise RunStopped(
                f"--replay: the simulation ran more steps in level {self._level} than the measured run"
                f" ({len(steps)}): replay the workload that run measured"
            )
        return steps

    def next_start(self, now: float) -> tuple[float, float]:
        steps = self._measured()
        start = steps[self._k][0]
        previous_end = steps[self._k - 1][1] if self._k else self._t0.get(self._level, start)
        check = max(previous_end, self._joined.get((self._level, start), previous_end))
        return check + self._shift + _EPSILON_S, start + self._shift

    def step_end(self, start: float, work: StepWork) -> float:
        end = self._measured()[self._k][1] + self._shift
        self._k += 1
        return end
