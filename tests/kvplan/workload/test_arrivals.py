"""Open-loop arrival processes (kvplan.workload.arrivals): gamma's spread is 1/sqrt(burstiness), constant
gaps are exact, a ramp-up's rate rises linearly, a bucket without ``arrival:`` draws today's Poisson
offsets bit for bit, and a simulated run reports the CV its own arrival times show."""

import json
import math

import numpy as np
import pytest

from kvplan.results.report.tables import throughput_table
from kvplan.results.run_result import load_run
from kvplan.results.simulated import CostModelInfo
from kvplan.run.driver import Finished, Level, Submission, run_level, schedule_levels
from kvplan.run.sim.cost import FixedStepCost, ModelClock
from kvplan.run.sim.facts import simulated_facts
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import SimSetup
from kvplan.traffic.requests import SampledRequest
from kvplan.workload.arrivals import Arrival, ArrivalOffsets, ramped
from kvplan.workload.schema import Workload
from tests.kvplan.cli_runner import run_cli

N = 2000


def offsets(arrival: Arrival | None, rate: float, n: int = N, seed: int = 7) -> np.ndarray:
    arrivals = ArrivalOffsets(np.random.default_rng(seed), rate, n, arrival)
    return np.array([arrivals[i] for i in range(n)])


def cv(gaps: np.ndarray) -> float:
    return float(np.std(gaps) / np.mean(gaps))


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_gaps_have_mean_one_over_rate_and_cv_one_over_sqrt_burstiness(burstiness):
    rate = 5.0
    got = offsets(Arrival(process="gamma", burstiness=burstiness), rate)
    gaps = np.diff(got)
    asked = 1 / math.sqrt(burstiness)  # Gamma(shape k): CV = 1 / sqrt(k)
    assert got[0] == 0.0 and len(gaps) == N - 1
    assert cv(gaps) == pytest.approx(asked, rel=0.15)
    # the mean of N - 1 gaps of CV c is off by c / sqrt(N - 1) standard errors: within 3 of them
    assert np.mean(gaps) == pytest.approx(1 / rate, rel=3 * asked / math.sqrt(N - 1))
    # the draw is vLLM's: Gamma(shape=B, scale=1/(rate*B)) gaps, the first arrival at 0
    expected = np.random.default_rng(7).gamma(burstiness, 1 / (rate * burstiness), size=N)
    assert np.array_equal(got, np.concatenate([[0.0], np.cumsum(expected[:-1])]))


def test_constant_gaps_are_exactly_one_over_rate():
    got = offsets(Arrival(process="constant"), 4.0, n=50)
    assert got[0] == 0.0 and set(np.diff(got)) == {0.25}  # 1/4 s, exact in binary
    assert np.std(np.diff(got)) == 0.0
    thirds = offsets(Arrival(process="constant"), 3.0, n=50)
    assert thirds[30] == 10.0 and np.diff(thirds) == pytest.approx(1 / 3, abs=1e-12)


def poisson_today(seed_words: list[int], rate: float, chunk: int, n: int) -> list[float]:
    """The offsets kvplan drew before arrival processes: exponential gaps in chunks, first at 0."""
    rng = np.random.default_rng(seed_words)
    out = [0.0, *np.cumsum(rng.exponential(1.0 / rate, size=chunk)[:-1])]
    while len(out) < n:
        out += list(out[-1] + np.cumsum(rng.exponential(1.0 / rate, size=chunk)))
    return [float(x) for x in out[:n]]


class InstantBackend:
    """A backend whose requests finish the moment they are taken: keeps each submission."""

    def __init__(self):
        self.clock, self.submitted, self.in_flight = 0.0, [], []

    def now(self) -> float:
        return self.clock

    def submit(self, submission: Submission) -> None:
        self.submitted.append(submission)
        self.in_flight.append(submission)

    def advance(self, until):
        done, self.in_flight, t = self.in_flight, [], self.clock
        return [Finished(s.request_id, s.arrival_time, t, t, (t,), 4, 1, "length") for s in done], []

    def wait_until(self, when: float) -> None:
        self.clock = when


class NullRecorder:
    def __init__(self):
        self.submitted: dict = {}

    def record(self, finished, steps) -> None:
        for out in finished:
            self.submitted.pop(out.request_id)


def bucket(**extra) -> dict:
    return {"name": "b", "input_tokens": 4, "output_tokens": 2, "request_rates": [4.0], "num_requests": 5, **extra}


def scheduled(workload: Workload, seed: int) -> list[float]:
    """The arrival times the driver gives the open-loop level of the workload's first bucket."""
    sampled = {b.name: [SampledRequest((1, 2, 3, 4), 2, "random")] * b.num_requests for b in workload.buckets}
    level = next(lv for lv in schedule_levels(workload, sampled) if lv.key.mode == "open")
    backend = InstantBackend()
    run_level(backend, level, NullRecorder(), seed)
    return [s.arrival_time for s in backend.submitted]


def test_a_bucket_without_arrival_draws_todays_poisson_offsets_bit_for_bit():
    # a 10 s level cycles its 5 requests, drawing 5 gaps a chunk: about 40 arrivals over 8 chunks
    workload = Workload.model_validate({"name": "w", "dataset": "random", "buckets": [bucket(duration_s=10.0)]})
    assert workload.buckets[0].arrival == Arrival()
    got = scheduled(workload, seed=3)
    today = poisson_today([3, 0, 4000], 4.0, chunk=5, n=200)
    assert len(got) > 20 and got == [t for t in today if t < 10.0]
    level = schedule_levels(workload, {"b": []})[0]
    assert isinstance(level, Level) and level.arrival == Arrival()


def test_the_driver_takes_the_buckets_arrival():
    workload = Workload.model_validate(
        {"name": "w", "dataset": "random", "buckets": [bucket(arrival={"process": "constant"})]}
    )
    assert scheduled(workload, seed=3) == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_a_ramp_up_rises_linearly_to_the_rate():
    rate, ramp = 4.0, 10.0
    # constant gaps, by hand: stationary offset i / 4 s; Lambda(t) = 4 t^2 / 20 for t < 10 s, so
    # t_i = sqrt(2 * 10 * i / 4) = sqrt(5 i) while i / 4 < 5, then i / 4 + 5
    got = offsets(Arrival(process="constant", ramp_up_s=ramp), rate, n=60)
    assert got[:20] == pytest.approx([math.sqrt(5 * i) for i in range(20)], abs=1e-12)
    assert got[20:] == pytest.approx([i / 4 + 5 for i in range(20, 60)], abs=1e-12)
    assert (got < ramp).sum() == rate * ramp / 2 == 20  # r R / 2 during the ramp
    assert (got < ramp / 2).sum() == 5  # Lambda(R / 2) = r R / 8: the rate rises linearly
    # Poisson: about r R / 2 = 500 arrivals in the ramp (Poisson count, sd ~22), then gaps of mean 1/r
    poisson = offsets(Arrival(ramp_up_s=250.0), rate)
    assert abs((poisson < 250.0).sum() - 500) < 3 * math.sqrt(500)
    after = np.diff(poisson[poisson >= 250.0])
    assert np.mean(after) == pytest.approx(1 / rate, rel=3 / math.sqrt(len(after)))
    assert ramped(3.0, 0.0) == 3.0 and ramped(1.0, 8.0) == 4.0 and ramped(4.0, 8.0) == 8.0


def test_a_simulated_gamma_level_reports_the_cv_of_its_own_arrival_times(tmp_path):
    workload = Workload.model_validate(
        {
            "name": "bursty",
            "seed": 0,
            "engine": {"model": "tiny-random-llama", "dtype": "float32", "block_size": 4, "num_blocks": 64},
            "dataset": "random",
            "buckets": [
                {
                    "name": "b",
                    "input_tokens": [4, 8],
                    "output_tokens": 3,
                    "concurrency": [2],
                    "request_rates": [50.0],
                    "arrival": {"process": "gamma", "burstiness": 0.5},
                    "num_requests": 40,
                }
            ],
        }
    )
    clock = lambda: ModelClock(FixedStepCost(0.002))  # noqa: E731
    setup = SimSetup(
        simulated_facts(workload, "cpu", "torch"), clock, CostModelInfo(kind="calibrated", description="2 ms")
    )
    run = load_run(simulate(workload, setup, tmp_path / "run", search=False))
    closed, opened = run.result.levels
    assert (closed.arrival_process, closed.requested_cv, closed.achieved_cv) == (None, None, None)
    arrivals = sorted(r.arrival_time for r in run.requests if r.mode == "open")
    gaps = np.diff(arrivals)
    assert len(arrivals) == 40
    assert opened.arrival_process == "gamma" and opened.requested_cv == pytest.approx(1 / math.sqrt(0.5))
    assert opened.achieved_cv == pytest.approx(np.std(gaps) / np.mean(gaps), rel=1e-12)
    table = throughput_table(run.result)
    closed_cell, open_cell = table["arrival CV (asked)"]
    assert closed_cell is None or math.isnan(closed_cell)  # an empty cell
    assert open_cell == f"{opened.achieved_cv:.2f} (1.41)"
    code, out, err = run_cli("report", str(run.run_dir), "--json")
    assert (code, err) == (0, "")
    levels = json.loads(out)["buckets"][0]["levels"]
    assert [(lv["arrival_process"], lv["requested_cv"], lv["achieved_cv"]) for lv in levels] == [
        (None, None, None),
        ("gamma", opened.requested_cv, opened.achieved_cv),
    ]
