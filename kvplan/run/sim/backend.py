"""The engine's own scheduler on a virtual clock, as a load-test backend: a simulation.

``SimBackend`` runs the driver's requests through the bundled engine's real ``Scheduler`` and
``BlockManager`` (imported, never copied; both torch-free) with no model: every scheduled request
"samples" a token that cannot be a prompt token (-1, outside every vocabulary), and every step
takes its start and end from a ``StepClock`` (kvplan.run.sim.cost). Admission, chunked prefill,
recompute preemption, prefix-cache hashes and hits (from the same token ids and cache salts) are
therefore the engine's own; only time is modelled::

    advance(until):  (check, start) = clock.next_start(now)
                     until <= check?  -> now = until, return (the driver submits the arrival first)
                     schedule(start) -> SchedulerOutput -> end = clock.step_end(start, work)
                     update_from_output(sampled -1s, end) -> finished requests + StepStats

A request's tokens all "reach the client" at the end of the step that produced them, as in the
engine. Where the clock has a ``submit_lag_s`` (a server's front end), a request joins the
scheduler's waiting queue that long after its arrival (its TTFT still counts from the arrival);
an idle scheduler waits for it. Where the clock has a ``front_end`` (kvplan.run.sim.cost.TextFrontEnd:
a server's tokenizer thread), a request first waits for that thread's batch to leave it, then takes
the lag; a batch is settled once no request still to come could join it (every arrival before the
driver's ``until`` is submitted, and a busy scheduler's completions come after ``now``).
Requests run with ignore_eos, so each produces exactly max_tokens tokens.

Arrivals during a decode run: while ``max_num_seqs`` requests run (and no admission policy,
offload tier, front-end lag or tokenizer thread is on) on a clock whose steps follow each other
with no gap (an arrival in a gap would delay the next step's start to it: the GPU targets' cost models have
none), an arrival only joins the waiting queue until a request finishes, which ends the run
anyway: every step up to then is the same whether it came or not, but for its ``num_waiting``.
So such a run is taken whole, to its end, at once (``_ahead``), and handed to the driver in
parts, each ending before the step the next arrival joins, with the queue's length as it is then
(``DecodeRunSteps.part``); the requests and the pool are brought forward once for the whole run
(nothing reads them before it ends: submitting a request only appends it to the queue).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import islice
from operator import attrgetter
from typing import Any, cast

from engine.config import SEED_LIMIT, EngineConfig
from engine.decode_run import SIMULATED_TOKEN_ID, decode_run
from engine.decode_step import DecodeBatch, DecodeStep
from engine.offload.tiers import Offload
from engine.outputs import SchedulerOutput
from engine.request import Request, SamplingParams
from engine.scheduler import Scheduler
from kvplan.results.run_result import EngineFacts
from kvplan.run.driver import Finished, Submission
from kvplan.run.sim.cost import ModelClock, StepClock, StepWork, TextFrontEnd, decode_work

_REQUEST_ID = attrgetter("request_id")


def scheduler_for(
    facts: EngineFacts, admission: Mapping[str, Any] | None = None, cls: type[Scheduler] = Scheduler
) -> Scheduler:
    """A fresh engine scheduler (``cls``) with the KV pool and limits of ``facts``, and ``admission``'s
    settings (EngineConfig's admission fields, engine.admission; None: off), so a simulation
    admits and refuses exactly the requests the engine would; with ``facts``' offload tiers
    (``offload_host_blocks``, ``offload_disk_blocks``), the engine's own tier policy on them
    (engine.offload.tiers.Offload without a mover: stores, loads and hits by tier, no bytes)."""
    config = EngineConfig(
        model="simulated",
        block_size=facts.block_size,
        num_blocks=facts.num_blocks,
        max_num_seqs=facts.max_num_seqs,
        max_num_batched_tokens=facts.max_num_batched_tokens,
        max_model_len=facts.max_model_len,
        enable_prefix_caching=facts.enable_prefix_caching,
        prefill_first=facts.prefill_first,
        **(admission or {}),
    )
    scheduler = cls(config, facts.num_blocks, facts.max_model_len)
    if facts.offload_host_blocks or facts.offload_disk_blocks:  # the engine's tiers, books only (no bytes)
        scheduler.block_manager.offload = Offload(
            facts.offload_host_blocks, facts.offload_disk_blocks, facts.bytes_per_block, facts.block_size
        )
    return scheduler


class SimBackend:
    """The driver's backend (kvplan.run.driver.Backend) over the engine's scheduler and ``clock``.

    Raises (from ``advance``):
        RuntimeError: a step that schedules nothing while requests wait (the scheduler could
            never run them; the load test's request checks rule this out beforehand).
    """

    takes_unbuilt_prompts = True  # the driver sends a trace prompt unbuilt (kvplan.traffic.trace.TraceTokens)

    def __init__(
        self,
        facts: EngineFacts,
        clock: StepClock,
        decode_runs: bool = True,
        admission: Mapping[str, Any] | None = None,
        defer_hashes: bool = True,
        residents: bool = True,
    ):
        self.scheduler = scheduler_for(facts, admission)
        self._ahead: tuple[Any, list[float], int] | None = None  # a run taken past arrivals: steps, checks, handed
        if defer_hashes:  # blocks hashed only where a lookup could tell (engine.deferred_hashes)
            self.scheduler.block_manager.defer_hashes()
        # steps whose running requests decode (engine.decode_step); residents False: a search probe's,
        # whose batch steps leave out the KV residents (none read them; a level's records keep them)
        self._batch = DecodeBatch(self.scheduler, residents)
        self.decode_runs = decode_runs  # take runs of pure decode steps together (engine.decode_run)
        self.clock = clock
        self.now_s = 0.0
        self.num_steps = 0
        self._level: str | None = None
        self._checked: dict[int, SamplingParams] = {}  # max_tokens -> its params, checked once (_params)
        self._lag = float(getattr(clock, "submit_lag_s", 0.0))
        self._front_end: TextFrontEnd | None = getattr(clock, "front_end", None)
        self._front_end_free_s = 0.0  # when the tokenizer thread's last batch left it
        self._tokenizing: deque[tuple[float, int, Request]] = deque()  # (arrival, prompt tokens, request)
        self._pending: deque[tuple[float, Request]] = deque()  # (when it reaches the scheduler, request)

    def now(self) -> float:
        return self.now_s

    def _through_arrivals(self) -> bool:
        """Whether no arrival can change the decode run that starts now but for the queue's length
        (see the module docstring)."""
        scheduler = self.scheduler
        return (
            len(scheduler.running) >= scheduler.max_num_seqs
            and scheduler.admission is None
            and scheduler.block_manager.offload is None
            and not self._lag
            and self._front_end is None  # a tokenizer thread's batches are settled at each step
            and type(self.clock) is ModelClock
            and not self.clock.cost.gap_s  # else an arrival in the gap before a step delays it
        )

    def _ahead_part(self, until: float | None) -> tuple[list[Finished], Sequence[Any]]:
        """The next part of the run taken past arrivals: its steps before the one the arrival at
        ``until`` joins (none: the clock moves to ``until``, as ``advance`` does for a step it
        joins)."""
        assert self._ahead is not None
        run, checks, done = self._ahead
        cut = len(run) if until is None else bisect_left(checks, until, done)
        if cut == done:
            self.now_s = max(self.now_s, until) if until is not None else self.now_s
            return [], []
        part = run.part(done, cut, len(self.scheduler.waiting)) if done or cut < len(run) else run
        self._ahead = None if cut == len(run) else (run, checks, cut)
        self.num_steps += cut - done
        self.now_s = run.ends[cut - 1]
        return [], part

    def submit(self, submission: Submission) -> None:
        level = submission.request_id.rsplit("/", 1)[0]  # LevelKey.id: request ids are "<level id>/<index>"
        if level != self._level:
            self._level = level
            self.clock.begin_level(level, self.now_s)
        params = self._params(submission.max_tokens, submission.seed, submission.output_token_ids)
        arrival = self.now_s if submission.arrival_time is None else submission.arrival_time
        request = Request(
            submission.request_id,
            submission.prompt_token_ids,
            params,
            arrival,
            submission.cache_salt,
            submission.tenant,
            submission.prompt_hashes,
        )
        if self._front_end is not None:  # batches leave in arrival order: _pending stays in time order
            self._tokenizing.append((arrival, len(submission.prompt_token_ids), request))
        elif self._lag > 0:
            self._pending.append((arrival + self._lag, request))  # arrivals come in time order
        else:
            self.scheduler.add_request(request, self.now_s)
            if self._ahead is not None and self.scheduler.has_untaken_finished():
                raise RuntimeError(  # the load test's request checks rule this out (kvplan.run.checks)
                    f"simulation: {submission.request_id} can never run (finished on arrival) during a decode run"
                )

    def _params(self, max_tokens: int, seed: int | None, forced: tuple[int, ...] | None) -> SamplingParams:
        """``SamplingParams(max_tokens, ignore_eos=True, seed, forced)``, its checks run once per
        int ``max_tokens`` (a level sends thousands of requests with a handful of lengths); a seed
        other than None or an int in [0, SEED_LIMIT), or forced tokens, go through them every time,
        so what they refuse is refused as before. Raises: ValueError, as SamplingParams does."""
        checked = self._checked.get(max_tokens) if forced is None and type(max_tokens) is int else None
        if checked is None or not (seed is None or (type(seed) is int and 0 <= seed < SEED_LIMIT)):
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=seed, forced_token_ids=forced)
            if forced is None and type(max_tokens) is int and max_tokens not in self._checked:
                self._checked[max_tokens] = params
            return params
        params = object.__new__(SamplingParams)  # frozen: filled through its __dict__, checked as above
        params.__dict__.update(checked.__dict__, seed=seed)
        return params

    def _tokenize(self, until: float | None, idle: bool) -> float | None:
        """Settle the tokenizer thread's batches that nothing still to come can join (into
        ``_pending``); the deadline of the first one still open, where it could leave before
        ``until``, else ``until``."""
        front, waiting = self._front_end, self._tokenizing
        assert front is not None  # only called with a front end
        next_arrival = math.inf if until is None else until
        known = next_arrival if idle else min(self.now_s, next_arrival)  # every arrival up to it submitted
        while waiting:
            window = islice(((a, n) for a, n, _ in waiting), front.max_batch + 1)
            batch = front.next_batch(self._front_end_free_s, window, known)
            if batch is None:  # still open: it closes by its deadline
                if idle:  # nothing happens before the next arrival (open until then: until <= deadline)
                    self.now_s = max(self.now_s, next_arrival)
                    return until
                deadline = max(self._front_end_free_s, waiting[0][0]) + front.window_s
                return deadline if deadline < next_arrival else until
            count, self._front_end_free_s = batch
            for _ in range(count):
                self._pending.append((self._front_end_free_s + self._lag, waiting.popleft()[2]))
        return until

    def _take_pending(self, until: float | None) -> float | None:
        """Hand the scheduler the requests that reached it by now (an idle one waits for the
        next); the earlier of ``until`` and the next one still on its way."""
        pending, scheduler = self._pending, self.scheduler
        idle = not (scheduler.running or scheduler.waiting or scheduler.has_untaken_finished())
        if self._tokenizing:
            until = self._tokenize(until, idle and not pending)
        if pending and idle:
            self.now_s = max(self.now_s, pending[0][0])
        while pending and pending[0][0] <= self.now_s:
            scheduler.add_request(pending.popleft()[1], self.now_s)
        if pending and (until is None or pending[0][0] < until):
            return pending[0][0]
        return until

    def advance(self, until: float | None) -> tuple[list[Finished], Sequence[Any]]:
        """One step, unless an arrival (``until``) comes before it would take new requests; or a
        whole decode run of steps (engine.decode_run), each the step the scheduler would
        take."""
        if self._ahead is not None:
            return self._ahead_part(until)
        if self._pending or self._tokenizing:
            until = self._take_pending(until)
        batch = self._batch
        if self.decode_runs and not batch.runs_ruled_out():
            batch.settle()
            if until is not None and self._through_arrivals():
                checks: list[float] = []
                run = decode_run(self.scheduler, self.clock, self.now_s, None, self.num_steps, decode_work, checks)
                if run is not None:
                    self._ahead = (run[0], checks, 0)
                    return self._ahead_part(until)
            run = decode_run(self.scheduler, self.clock, self.now_s, until, self.num_steps, decode_work)
            if run is not None:
                steps, self.now_s = run
                self.num_steps += len(steps)
                return [], steps  # a DecodeRunSteps: each step's StepStats built where it is read
        check, start = self.clock.next_start(self.now_s)
        if until is not None and until <= check:
            self.now_s = max(self.now_s, until)
            return [], []
        scheduler = self.scheduler
        if self.decode_runs and (step := batch.schedule(start)) is not None:
            return self._decodes(step, start)  # every running request decodes (engine.decode_step)
        batch.settle()
        output = scheduler.schedule(start)
        if output.is_empty and not scheduler.has_untaken_finished():
            raise RuntimeError("simulation: a step scheduled nothing while requests wait")
        work = StepWork.of(output)
        offload = scheduler.block_manager.offload
        if offload is not None:  # the blocks this step's admissions loaded back (on its critical path)
            host, disk = offload.step_loads()
            if host or disk:
                work = replace(work, num_host_loads=host, num_disk_loads=disk)
        end = self.clock.step_end(start, work) if not output.is_empty else start
        # every scheduled request "samples" -1 (one that does not sample never reads it)
        sampled = dict.fromkeys(map(_REQUEST_ID, output.scheduled), SIMULATED_TOKEN_ID)
        scheduler.update_from_output(output, sampled, end)
        finished = [_finished(r) for r in scheduler.take_finished()]
        stats = scheduler.step_stats(self.num_steps, start, end, output, len(finished))
        self.num_steps += 1
        self.now_s = end
        return finished, [stats]

    def _decodes(self, step: DecodeStep, start: float) -> tuple[list[Finished], Sequence[Any]]:
        """``advance``'s step for a ``DecodeStep``: timed from its counts, brought forward, recorded."""
        scheduler = self.scheduler
        end = self.clock.step_end(start, StepWork.of(step))
        step = self._batch.update(step, SIMULATED_TOKEN_ID, end)
        finished = [_finished(r) for r in scheduler.take_finished()]
        stats = scheduler.step_stats(self.num_steps, start, end, cast(SchedulerOutput, step), len(finished))
        self.num_steps += 1
        self.now_s = end
        return finished, [stats]

    def wait_until(self, when: float) -> None:
        self.now_s = max(self.now_s, when)


def _finished(request: Request) -> Finished:
    finish_time, finish_reason = request.finish_time, request.finish_reason
    assert finish_time is not None and finish_reason is not None  # set on every request take_finished gives
    return Finished(
        request_id=request.request_id,
        arrival_time=request.arrival_time,
        first_scheduled_time=request.first_scheduled_time,
        finish_time=finish_time,
        token_times=tuple(request.token_times),
        num_prompt_tokens=request.num_prompt_tokens,
        num_output_tokens=len(request.output_token_ids),
        finish_reason=finish_reason,
        finish_detail=request.finish_detail,
        num_preemptions=request.num_preemptions,
        num_cached_tokens=request.num_cached_tokens,
    )
