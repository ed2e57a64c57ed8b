"""The simulator replays the engine's own scheduling exactly: a measured load test of the tiny
random model and its simulation agree at every step (used blocks, preemptions, who holds KV,
prefix hits) and on the knee, for closed- and open-loop levels, shared prefixes under prefix
caching with tenant salts, chunked prefill and recompute preemption.

Open-loop arrivals meet the scheduler by the clock, so the simulation replays the measured
run's own step times (kvplan.run.sim.replay); closed-loop levels agree under any clock.
"""

from pathlib import Path

import pytest

from kvplan.results.run_result import load_run
from kvplan.results.simulated import CostModelInfo
from kvplan.run.loadtest import run_loadtest
from kvplan.run.sim.cost import FixedStepCost, ModelClock
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import SimSetup, replay_setup
from kvplan.workload.file import load_workload

WORKLOAD = Path(__file__).resolve().parents[2] / "data" / "sim_exact.yaml"
SAME = (
    "num_used_blocks",
    "num_free_blocks",
    "num_preemptions",
    "num_running",
    "num_prefill_tokens",
    "num_decode_tokens",
    "kv_resident_tokens",
    "kv_resident_request_ids",
    "num_prefix_queried_tokens",
    "num_prefix_hit_tokens",
    "num_prefill_seqs",
    "num_context_tokens",
    "num_attended_tokens",
    "num_finished",
)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return load_run(run_loadtest(load_workload(WORKLOAD), tmp_path_factory.mktemp("measured") / "run"))


def by_level(steps):
    levels = {}
    for s in steps:
        levels.setdefault(s.key, []).append(s)
    return levels


def test_the_workload_exercises_what_it_claims(measured):
    steps = measured.steps
    assert sum(s.num_preemptions for s in steps) > 0  # recompute preemption
    assert sum(s.num_prefix_hit_tokens for s in steps) > 0  # shared prefixes hit the cache
    assert any(s.num_prefill_tokens == 24 and s.num_prefill_seqs >= 1 for s in steps)  # the budget cuts prefills
    assert {(lv.mode, lv.variant) for lv in measured.result.levels} == {
        ("closed", "cached"),
        ("closed", "uncached"),
        ("open", "cached"),
        ("open", "uncached"),
    }


def test_replayed_simulation_agrees_with_the_measured_run_at_every_step(measured, tmp_path):
    workload = load_workload(WORKLOAD)
    run = load_run(simulate(workload, replay_setup(workload, measured.run_dir), tmp_path / "sim"))
    assert run.result.source == "simulated" and run.result.cost_model.kind == "replay"
    mine, theirs = by_level(run.steps), by_level(measured.steps)
    assert list(mine) == list(theirs)
    for key, steps in theirs.items():
        assert len(mine[key]) == len(steps), key
        for a, b in zip(mine[key], steps):
            for field in SAME:
                assert getattr(a, field) == getattr(b, field), (key, b.step_index, field)
            # the replayed clock: each step lasts what it lasted on the engine
            assert a.end_time - a.start_time == pytest.approx(b.end_time - b.start_time, abs=1e-9)
            if key.mode == "closed":
                assert a.num_waiting == b.num_waiting
    for a, b in zip(run.result.levels, measured.result.levels):
        assert (a.key, a.peak_used_blocks, a.num_preemptions, a.num_completed, a.prefix_hit_rate) == (
            b.key,
            b.peak_used_blocks,
            b.num_preemptions,
            b.num_completed,
            b.prefix_hit_rate,
        )
    assert [(b.measured_knee, b.max_clean_concurrency) for b in run.result.buckets] == [
        (b.measured_knee, b.max_clean_concurrency) for b in measured.result.buckets
    ]

    # Every request is the same request: the same prompt length, output length and preemptions.
    def shape(rs):
        return sorted(
            (r.request_id, r.num_prompt_tokens, r.num_output_tokens, r.num_preemptions, r.num_cached_tokens) for r in rs
        )

    assert shape(run.requests) == shape(measured.requests)


def test_closed_loop_levels_agree_under_any_clock(measured, tmp_path):
    workload = load_workload(WORKLOAD)
    facts = replay_setup(workload, measured.run_dir).facts
    setup = SimSetup(
        facts,
        lambda: ModelClock(FixedStepCost(0.123)),
        CostModelInfo(kind="calibrated", description="every step 123 ms"),
    )
    run = load_run(simulate(workload, setup, tmp_path / "sim"))
    mine, theirs = by_level(run.steps), by_level(measured.steps)
    for key in (k for k in theirs if k.mode == "closed"):
        assert [[getattr(s, f) for f in SAME] for s in mine[key]] == [
            [getattr(s, f) for f in SAME] for s in theirs[key]
        ]
    assert all(s.end_time - s.start_time == pytest.approx(0.123) for s in run.steps)


def test_the_simulated_knee_is_the_lowest_preempting_concurrency(measured):
    from kvplan.run.sim.search import Prober, knee_clock

    workload = load_workload(WORKLOAD)
    facts = replay_setup(workload, measured.run_dir).facts
    from kvplan.run.sim.run import sample

    sampled = sample(workload, facts).requests
    prober = Prober(workload, facts, knee_clock, sampled)
    # every concurrency from 1, run whole: the first that preempts
    preempts = [prober.level(0, "closed", c).num_preemptions > 0 for c in range(1, 11)]
    knee = preempts.index(True) + 1
    assert prober.knee(0) == knee == measured.result.estimate.buckets[0].simulated_knee
    assert measured.result.buckets[0].simulated_knee == knee
    assert not any(preempts[: knee - 1])
