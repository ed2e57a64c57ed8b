"""kvplan.run.sim.replay.ReplayClock on hand-made records: which arrivals join which replayed step.

A request the driver submitted between two steps joins the later one's waiting queue whether or not
that step admits it; its recorded ``submit_time`` says so. Before submit times were recorded, the
clock knew only the requests first scheduled in a step, and deferred a submitted-but-waiting one
past the step, behind requests submitted at that step's end (a multi-turn level with think times
of milliseconds then admitted turns in another order)."""

from kvplan.results.records import RequestRecord, StepRecord
from kvplan.run.sim.cost import StepWork
from kvplan.run.sim.replay import _EPSILON_S, ReplayClock

LEVEL = dict(bucket="chat", mode="closed", level=2)
WORK = StepWork(0, 1, 0, 1, 1, 1)


def step(start: float, end: float) -> StepRecord:
    zero = dict.fromkeys(
        (
            "num_prefill_tokens",
            "num_decode_tokens",
            "num_running",
            "num_waiting",
            "num_used_blocks",
            "num_free_blocks",
            "num_total_blocks",
            "num_preemptions",
            "num_finished",
            "num_oom",
            "num_prefix_queried_tokens",
            "num_prefix_hit_tokens",
            "ideal_bytes",
            "paged_bytes",
            "contiguous_bytes",
            "measured_bytes",
        ),
        0,
    )
    return StepRecord(step_index=0, **LEVEL, start_time=start, end_time=end, kv_resident_tokens=(), **zero)


def request(rid: str, arrival: float, first_scheduled: float, submitted: float | None) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        **LEVEL,
        arrival_time=arrival,
        first_scheduled_time=first_scheduled,
        finish_time=first_scheduled + 1,
        token_times=(first_scheduled + 1,),
        num_prompt_tokens=4,
        num_output_tokens=1,
        max_tokens=1,
        finish_reason="length",
        submit_time=submitted,
    )


STEPS = [step(10.0, 11.0), step(11.5, 12.5), step(13.0, 14.0)]


def checks(requests: list[RequestRecord]) -> list[float]:
    """Each replayed step's check (the latest arrival that joins it), level started at 10.0."""
    clock = ReplayClock(STEPS, requests)
    clock.begin_level(STEPS[0].key.id, 10.0)  # no shift
    out = []
    for s in STEPS:
        check, start = clock.next_start(0.0)
        assert start == s.start_time
        out.append(round(check - _EPSILON_S, 9))
        assert clock.step_end(start, WORK) == s.end_time
    return out


def test_a_request_submitted_between_steps_joins_the_next_step_even_if_not_admitted_there():
    first = request("chat/closed/2/0", 10.0, 10.0, 10.0)
    waiting = request("chat/closed/2/1", 11.2, 13.0, 11.3)  # submitted before step 1, admitted at step 2
    assert checks([first, waiting]) == [10.0, 11.2, 12.5]
    # a run recorded before submit times: only first scheduling is known, so step 1 waits for nothing
    old = request("chat/closed/2/1", 11.2, 13.0, None)
    assert checks([first, old]) == [10.0, 11.0, 12.5]
    # submitted after step 1 started: it cannot have joined step 1
    late = request("chat/closed/2/1", 11.6, 13.0, 11.6)
    assert checks([first, late]) == [10.0, 11.0, 12.5]
