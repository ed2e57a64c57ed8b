"""The simulator's disaggregated deployment (kvplan.run.sim.disagg) replays the bundled in-process
disaggregated engine (engine.disagg.inproc.DisaggEngine, the tiny random model) exactly: timed by
the run's MEASURED step times and transfer times, it schedules the same requests with the same
token counts in every step of every prefill and decode worker, admits every handoff at the same
decode step, holds the same blocks after every step, and streams every token at the same time.

The replay (issue 36 item 2, the aggregated exactness test's mechanism extended to two pools):

- a worker's clock (``LoopClock``) replays the engine's loop: DisaggEngine.step runs every
  prefill worker's step, then each decode worker's ``begin_step`` (joins, then FIFO admission) and
  its step. A simulated worker's next step starts at the first measured start at or after the time
  it may start (a prefill worker's starts are all its measured steps, also those that scheduled
  nothing, since such a step may have preempted; a decode worker's are its measured ``begin_step``
  times, with a step or not) and ends at that step's measured end;
- a transfer (``LoopLink``) ends when the run's ``complete`` of that request ended: from its
  admission, the rest of the admitting decode step and the export/import in the next loop
  (inproc.py: a transfer overlaps the decode step it was admitted in).

The engine keeps a handoff's blocks under a second key (engine.disagg.scheduler.held_key), the
simulator under the request's own; both count the same blocks in use.
"""

import time
from bisect import bisect_left

import pytest

from engine.config import EngineConfig
from engine.disagg.inproc import DisaggEngine
from engine.disagg.workers import worker_engine
from engine.request import SamplingParams
from kvplan.run.bundled.backend import engine_facts
from kvplan.run.driver import Submission
from kvplan.run.sim.cost import StepWork
from kvplan.run.sim.disagg import DisaggBackend
from kvplan.sizing.gpus.links import Link
from tests.engine.tiny import TINY, random_prompts

SETTINGS = dict(model=TINY, dtype="float32", device="cpu", attention_backend="torch", block_size=4)
SAME = ("num_prefill_tokens", "num_decode_tokens", "num_running", "num_used_blocks", "num_preemptions")
SAME += ("num_finished", "num_prefill_seqs", "num_context_tokens", "num_prefix_queried_tokens", "num_prefix_hit_tokens")
_EPS = 1e-9


class LoopClock:
    """A StepClock over one worker's measured loop: ``starts`` (a prefill worker's step starts, a
    decode worker's begin_step times) and ``steps`` ({start: end} of the steps it ran), in
    seconds from the run's start. Past the last start, a start is allowed at once: the simulated
    worker must find nothing to run there (``step_end`` fails otherwise)."""

    submit_lag_s = 0.0

    def __init__(self, starts: list[float], steps: dict[float, float]):
        self.starts, self.steps = starts, steps

    def begin_level(self, level_id: str, now: float) -> None:
        pass

    def next_start(self, now: float) -> tuple[float, float]:
        i = bisect_left(self.starts, now - _EPS)
        at = self.starts[i] if i < len(self.starts) else now  # past the run's loop: a step must find nothing
        return at, at

    def step_end(self, start: float, work: StepWork) -> float:
        later = [s for s in self.steps if s >= start - _EPS]
        assert later, f"the simulation steps at {start:.6f} s; the run did not"
        first = min(later)
        # a decode worker's step follows its begin_step at once: none may lie between them
        assert bisect_left(self.starts, first - _EPS) == bisect_left(self.starts, start - _EPS) + (first > start)
        return self.steps[first]


class LoopLink:
    """A link whose transfers end when the run's did (``ends``: request id -> s); records each
    admission time (``admitted``)."""

    def __init__(self, ends: dict[str, float]):
        self.ends, self.admitted, self.moving = ends, {}, set()

    def __len__(self) -> int:
        return len(self.moving)

    def start(self, key: str, now: float, num_bytes: float) -> None:
        self.admitted[key] = now
        self.moving.add(key)

    def next_end(self) -> float | None:
        return min((self.ends[k] for k in self.moving), default=None)

    def take_done(self, now: float) -> list[str]:
        done = sorted(k for k in self.moving if self.ends[k] <= now + _EPS)
        self.moving -= set(done)
        return done


def record_schedules(scheduler) -> list:
    """Wrap ``scheduler.schedule`` to keep, for every step that schedules something, its
    {request id: tokens}."""
    seen: list = []
    schedule = scheduler.schedule

    def recorded(*args, **kwargs):
        out = schedule(*args, **kwargs)
        if not out.is_empty:
            seen.append([(s.request_id, len(s.token_ids), s.num_computed_tokens) for s in out.scheduled])
        return out

    scheduler.schedule = recorded
    return seen


def measure(prompts, max_tokens, prefill, decode, **settings):
    """Run the in-process disaggregated engine on ``prompts`` (all added at once) and record its loop."""
    config = EngineConfig(**{**SETTINGS, **settings})
    engine = DisaggEngine(
        [worker_engine(config, "prefill") for _ in range(prefill)],
        [worker_engine(config, "decode") for _ in range(decode)],
    )
    schedules = [record_schedules(w.scheduler) for w in (*engine.prefill, *engine.decode)]
    begins: list[list[float]] = [[] for _ in engine.decode]
    admitted: dict[str, float] = {}
    moved: dict[str, float] = {}
    for j, dw in enumerate(engine.decode):

        def begin(now=None, dw=dw, j=j, begin_step=dw.begin_step):
            now = time.perf_counter()
            begins[j].append(now)
            taken = begin_step(now)
            admitted.update((h.request_id, now) for h in taken)
            return taken

        def complete(request_id, payload, seconds, complete=dw.complete):
            complete(request_id, payload, seconds)
            moved[request_id] = time.perf_counter()

        dw.begin_step, dw.complete = begin, complete
    t0 = time.perf_counter()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    outs = {}
    while engine.has_unfinished():
        outs.update((o.request_id, o) for o in engine.step())
    facts = engine_facts(engine.prefill[0].engine), engine_facts(engine.decode[0].engine)
    return dict(
        t0=t0,
        ids=ids,
        outs=outs,
        facts=facts,
        stats=[*engine.prefill_stats, *engine.decode_stats],
        begins=begins,
        admitted=admitted,
        moved=moved,
        schedules=schedules,
    )


def replay(run, prompts, max_tokens, prefill, decode):
    t0 = run["t0"]
    stats = [[s for s in worker if s.num_prefill_tokens + s.num_decode_tokens] for worker in run["stats"]]
    clocks = iter(
        [
            *(
                # every step the run took, also one that scheduled nothing (it may have preempted)
                LoopClock([s.start_time - t0 for s in every], {s.start_time - t0: s.end_time - t0 for s in w})
                for every, w in zip(run["stats"][:prefill], stats[:prefill], strict=True)
            ),
            *(
                LoopClock(
                    [b - t0 for b in run["begins"][j]], {s.start_time - t0: s.end_time - t0 for s in stats[prefill + j]}
                )
                for j in range(decode)
            ),
        ]
    )
    pre, dec = run["facts"]
    backend = DisaggBackend(
        (pre, lambda: next(clocks), prefill), (dec, lambda: next(clocks), decode), Link("x", 1e9, 0.0), lambda n: 0.0
    )
    backend.links = [LoopLink({k: v - t0 for k, v in run["moved"].items()}) for _ in range(decode)]
    schedules = [record_schedules(w.scheduler) for w in (*backend.prefill, *backend.decode)]
    for rid, prompt in zip(run["ids"], prompts, strict=True):
        backend.submit(Submission(rid, tuple(prompt), max_tokens, 0, "", arrival_time=0.0))
    done = {}
    while len(done) < len(prompts):
        finished, _ = backend.advance(None)
        done.update((f.request_id, f) for f in finished)
    return backend, schedules, done


@pytest.mark.parametrize(
    ("prefill", "decode", "settings", "max_tokens"),
    [
        (1, 1, dict(num_blocks=64, max_num_seqs=4), 6),
        (2, 3, dict(num_blocks=64, max_num_seqs=4), 6),
        # a small decode pool and budget: handoffs wait for blocks and for max_num_seqs, prompts chunk
        (1, 1, dict(num_blocks=14, max_num_seqs=3, max_num_batched_tokens=16), 6),
        # prefix caching on both pools, prompts sharing whole blocks: hits on the prefill worker
        (1, 2, dict(num_blocks=24, max_num_seqs=3, enable_prefix_caching=True), 6),
        # 10 blocks and 12 tokens out: recompute preemption on both workers (the decode worker
        # recomputes prompt + output so far)
        (1, 1, dict(num_blocks=10, max_num_seqs=3, max_num_batched_tokens=16), 12),
    ],
)
def test_the_simulation_with_measured_times_equals_the_in_process_disaggregated_run(
    prefill, decode, settings, max_tokens
):
    prompts = random_prompts([5, 12, 8, 17, 3, 9, 14, 6], seed=5)
    if settings.get("enable_prefix_caching"):
        prompts = [prompts[3][:8] + p if i % 2 else p for i, p in enumerate(prompts)]  # 2 shared blocks
    run = measure(prompts, max_tokens, prefill, decode, **settings)
    backend, schedules, done = replay(run, prompts, max_tokens, prefill, decode)
    t0 = run["t0"]
    if settings.get("max_num_batched_tokens") == 16:  # what the small pool claims to exercise
        steps = run["stats"][0]
        assert any(0 < s.num_prefill_tokens == 16 for s in steps)  # the budget chunks a prompt
        handed = {rid: out.token_times[0] for rid, out in run["outs"].items()}
        waited = [r for r, at in run["admitted"].items() if at > min(b for b in run["begins"][0] if b > handed[r])]
        assert waited  # some handoff passed a begin_step without admission (seqs or blocks full)
    if settings.get("enable_prefix_caching"):
        assert sum(s.num_prefix_hit_tokens for s in run["stats"][0]) > 0
    if max_tokens == 12:
        assert sum(s.num_preemptions for s in run["stats"][1]) > 0  # the decode worker preempted
    # which requests, with how many tokens, every step of every worker
    assert schedules == run["schedules"]
    workers = [*backend.prefill, *backend.decode]
    measured = [[s for s in w if s.num_prefill_tokens + s.num_decode_tokens] for w in run["stats"]]
    for w, steps in zip(workers, measured, strict=True):
        assert len(w.steps) == len(steps)
        for a, b in zip(w.steps, steps, strict=True):
            for field in SAME:
                assert getattr(a, field) == getattr(b, field), (b.step_index, field)
            assert a.end_time == pytest.approx(b.end_time - t0, abs=1e-9)
    # every handoff admitted at the same decode begin_step, its KV moved when the run's did
    admitted = {k: v for link in backend.links for k, v in link.admitted.items()}
    assert admitted.keys() == run["admitted"].keys() == set(run["ids"])
    for rid, at in run["admitted"].items():
        assert admitted[rid] == pytest.approx(at - t0, abs=1e-9)
    # every token streamed at the end of the step that sampled it in the run (the engine stamps a
    # token inside its step, just before the step's own end; the loop runs one step at a time)
    spans = [(s.start_time - t0, s.end_time - t0) for w in measured for s in w]
    for rid in run["ids"]:
        out, sim = run["outs"][rid], done[rid]
        assert sim.num_output_tokens == len(out.output_token_ids) == max_tokens
        ends = [next(e for b, e in spans if b <= t - t0 <= e) for t in out.token_times]
        assert sim.token_times == pytest.approx(ends, abs=1e-9)
        assert sim.kv_transfer_s == pytest.approx(run["moved"][rid] - run["admitted"][rid], abs=1e-9)
