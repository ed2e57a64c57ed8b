"""A disaggregated deployment simulated: x prefill and y decode engine schedulers, a KV transfer between.

Every worker is the bundled disaggregated engine's own scheduler (engine.disagg.scheduler.
DisaggScheduler: the aggregated ``Scheduler`` that holds a finished prefill's blocks, or joins a
moved request) and ``BlockManager`` on its own clock (as kvplan.run.sim.backend's single engine),
and the pools follow the shared disaggregation rules
(docs/simulate.md, "Disaggregated targets")::

    arrival i -> prefill worker i mod x: the request with max_tokens 1 (token 1 streams at the end
        of the step that samples it: the client's TTFT); its blocks stay held (a handoff)
    handoff -> decode worker i mod y, FIFO: admitted at the start of that worker's step while
        running + in transfer < max_num_seqs and its pool allocates prompt + 1 tokens' blocks
    admitted -> the prompt's KV moves over the worker's link (kvplan.sizing.gpus.links.SharedLink:
        setup + bytes / bandwidth, shared equally); at its end the prefill worker frees the blocks
    moved -> the request joins the decode worker's running set at its first step starting at or
        after the transfer's end, num_computed_tokens = prompt, token 1 its next input

With ``first_token="decode"`` the client's tokens all come from the decode worker, as vLLM's
disaggregated proxies stream them (github vllm-project/vllm
benchmarks/disagg_benchmarks/disagg_prefill_proxy_server.py: the prefill request runs with
max_tokens 1 and its answer is dropped, then the decode server's stream is the client's): the
decode worker runs one step more (its first step yields the client's token 1, after the KV has
moved) and the prefill worker's token never reaches the client; a max_tokens-1 request is handed
off too.

A handoff that can never run on its decode worker (more blocks than its pool, or past max_model_len)
ends at the prefill step that made it as ``cannot_fit``, its prefill blocks freed: it never waits.

Events run in time order (ties: step ends, then transfer ends, then step starts; workers in
index order). A step is scheduled at its start and updated at its end, so what another worker
does meanwhile (a transfer freeing prefill blocks) lands between the two, as on a real cluster.
The backend reports requests as the router streams them (token 1 from the prefill worker, the
rest from the decode worker) and the seconds each one's KV took to move (``kv_transfer_s``);
each pool's steps are kept in ``steps`` (the driver gets none: two pools have no one step index).
A decode worker's pure decode steps are taken together (engine.decode_run), equal step for step to
stepping them: timed when the run starts, taken when the worker next starts a step or its finishing
step ends, and cut at a transfer's end or where a handoff arrives that it would admit (``_run``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from engine.decode_run import SIMULATED_TOKEN_ID, PlannedRun, decode_run, plan_decode_run
from engine.disagg.scheduler import DisaggScheduler
from engine.outputs import DecodeRunSteps
from engine.request import FinishReason, Request, SamplingParams
from engine.scheduler import Scheduler
from kvplan.results.run_result import EngineFacts
from kvplan.run.driver import Finished, Submission
from kvplan.run.sim.backend import _finished, scheduler_for
from kvplan.run.sim.cost import ModelClock, StepClock, StepWork, decode_work
from kvplan.sizing.gpus.links import Link, SharedLink

_REQUEST_ID = attrgetter("request_id")
_FINISHING = object()  # a decode worker's step in flight that is a pending run's last, finishing step


@dataclass
class _Worker:
    scheduler: Scheduler
    clock: StepClock
    now: float = 0.0  # when it may start its next step
    idle: bool = True  # nothing to do until an outside event (a request, a handoff, a freed block)
    step: tuple[Any, float, float] | None = None  # (SchedulerOutput, start, end) while a step runs
    parts: list[Any] = field(default_factory=list)  # its steps: a StepStats, or a decode run's DecodeRunSteps
    num_steps: int = 0
    handoffs: deque[tuple[float, Request]] = field(default_factory=deque)  # decode: (ready at, prefilled)
    moving: dict[str, tuple[float, Request]] = field(default_factory=dict)  # decode: id -> (start, prefilled)
    moved: list[tuple[float, Request]] = field(default_factory=list)  # decode: (moved at, prefilled)
    # decode: a run timed from ``now`` (the clock before it), not yet taken (DisaggBackend._run)
    pending: tuple[PlannedRun, float] | None = None

    def wake(self, at: float) -> None:
        self.idle, self.now = False, max(self.now, at)

    def take_run(self, before: float | None = None) -> None:
        """Take the pending run's steps (where ``before``, s, cuts it short: those starting before it;
        else it stays pending) and the clock to the end of the last one taken. A run that ends in a
        step finishing requests is in flight as that step (``step``), taken at its end (``_end``)."""
        if self.pending is None:
            return
        run, start = self.pending
        k = len(run.ends) if before is None else bisect_left(run.starts, before)
        if k == len(run.ends) and (before is not None or run.finish_at == k):
            return  # not cut; a finishing run is taken at its last step's end
        self.pending = None
        if self.step is not None and self.step[0] is _FINISHING:
            self.step = None  # cut before the step that would have finished requests
        if not k:
            self.now = start
            return
        parts, self.now = run.take(k)
        self.parts += parts
        self.num_steps += k

    @property
    def steps(self) -> list[Any]:
        """Every step's StepStats in order (a decode run's built here, where they are read)."""
        self.take_run()
        return [s for part in self.parts for s in (part if isinstance(part, DecodeRunSteps) else (part,))]


class DisaggBackend:
    """The driver's backend (kvplan.run.driver.Backend) over ``x`` prefill and ``y`` decode engine
    schedulers (each pool's ``facts``: KV pool and limits; ``clock``: a fresh StepClock per worker)
    and one ``link`` into each decode worker; ``transfer_bytes(prompt_tokens)``: bytes a rank moves.

    Raises (from ``advance``):
        RuntimeError: requests in flight while no worker can step and nothing moves (the request
            checks against both pools rule it out beforehand).
    """

    takes_unbuilt_prompts = True  # the driver sends a trace prompt unbuilt (kvplan.traffic.trace.TraceTokens)

    def __init__(
        self,
        prefill: tuple[EngineFacts, Callable[[], StepClock], int],
        decode: tuple[EngineFacts, Callable[[], StepClock], int],
        link: Link,
        transfer_bytes: Callable[[int], float],
        first_token: str = "prefill",
        decode_runs: bool = True,
    ):
        self.prefill = [_Worker(_disagg_scheduler(prefill[0], hold=True), prefill[1]()) for _ in range(prefill[2])]
        self.decode = [_Worker(_disagg_scheduler(decode[0], hold=False), decode[1]()) for _ in range(decode[2])]
        self.links = [SharedLink(link) for _ in self.decode]
        self.transfer_bytes = transfer_bytes
        self.decode_first = first_token == "decode"  # the client's token 1 from the decode worker
        self.decode_runs = decode_runs  # a decode worker's pure decode steps taken together (_run)
        self.now_s = 0.0
        self._count = 0  # requests routed so far (the router's index i)
        self._route: dict[str, tuple[int, int, int]] = {}  # id -> (prefill worker, decode worker, max_tokens)
        self._level: str | None = None
        self.transfer_s: dict[str, float] = {}

    def now(self) -> float:
        return self.now_s

    def wait_until(self, when: float) -> None:
        self.now_s = max(self.now_s, when)

    def submit(self, submission: Submission) -> None:
        level = submission.request_id.rsplit("/", 1)[0]
        if level != self._level:
            self._level = level
            for worker in (*self.prefill, *self.decode):
                worker.clock.begin_level(level, self.now_s)
        i, self._count = self._count, self._count + 1
        p, d = i % len(self.prefill), i % len(self.decode)
        self._route[submission.request_id] = (p, d, submission.max_tokens)
        params = SamplingParams(max_tokens=1, ignore_eos=True, forced_token_ids=submission.output_token_ids)
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
        self.prefill[p].scheduler.add_request(request, self.now_s)
        self.prefill[p].wake(self.now_s)

    def _events(self) -> list[tuple[float, int, float, str, int]]:
        """(time, tie order, time up to which arrivals join it, kind, index) of every next event."""
        events = []
        for kind, workers in (("prefill", self.prefill), ("decode", self.decode)):
            for i, w in enumerate(workers):
                if w.step is not None:
                    events.append((w.step[2], 0, w.step[2], f"{kind}-end", i))
                elif not w.idle:
                    check, start = w.clock.next_start(w.now)
                    events.append((start, 2, check, f"{kind}-start", i))
        for i, link in enumerate(self.links):
            if (at := link.next_end()) is not None:
                events.append((at, 1, at, "moved", i))
        return events

    def advance(self, until: float | None) -> tuple[list[Finished], list[Any]]:
        """The next event (a step's start or end, a transfer's end), unless an arrival (``until``)
        comes first; the requests finished by it."""
        events = self._events()
        if not events:
            if until is None:
                raise RuntimeError("simulation: requests in flight but no worker can step and nothing moves")
            self.now_s = max(self.now_s, until)
            return [], []
        at, _, check, kind, i = min(events, key=lambda e: (e[0], e[1], e[3], e[4]))
        if until is not None and until <= check:
            self.now_s = max(self.now_s, until)
            return [], []
        self.now_s = max(self.now_s, at)
        if kind == "moved":
            self._moved(i, at)
            return [], []
        pool = self.prefill if kind.startswith("prefill") else self.decode
        worker = pool[i]
        if kind.endswith("start"):
            if pool is self.decode:
                worker.take_run()
                self._admit(i, at)
                if self.decode_runs and self._run(i):
                    return [], []
            self._start(worker, at)
            return [], []
        return self._end(worker, pool is self.prefill, at), []

    def _run(self, d: int) -> bool:
        """Decode worker ``d``'s steps from the one starting now (its handoffs admitted) as a decode
        run (engine.decode_run, equal step for step), up to the first step its link's next transfer
        end could change (a moved request joins at the next step start), or (without prefix caching)
        the step that finishes the requests nearest their max_tokens, in flight (``step``) until its
        end, where ``_end`` takes the run. The run is timed now and taken when the worker next
        starts a step (``_Worker.take_run``); a handoff it would admit cuts it first (``_handoff``).
        On a clock with a gap between steps (a handoff arriving in a gap delays the next step) the
        run is taken at once, up to the earliest end a prefill step can have (every prefill worker
        busy, else no run). Only on a ``ModelClock``. Whether a run was taken."""
        worker = self.decode[d]
        clock = worker.clock
        if type(clock) is not ModelClock:
            return False
        scheduler = worker.scheduler
        until = self.links[d].next_end()
        if not clock.cost.gap_s:
            run = plan_decode_run(scheduler, clock, worker.now, until, worker.num_steps, decode_work, finish=True)
            if run is None:
                return False
            worker.pending, worker.now = (run, worker.now), run.ends[-1]
            if run.finish_at == len(run.ends):  # its last step finishes requests: in flight until its end
                worker.step = (_FINISHING, run.starts[-1], run.ends[-1])
            return True
        for p in self.prefill:  # a gap clock: a handoff in a gap delays the next step, admitted or not
            if p.idle:  # it may start a step at any time (a request, a freed block)
                return False
            at = p.step[2] if p.step is not None else p.clock.next_start(p.now)[1]
            until = at if until is None else min(until, at)
        taken = decode_run(scheduler, clock, worker.now, until, worker.num_steps, decode_work)
        if taken is None:
            return False
        steps, worker.now = taken
        worker.parts.append(steps)
        worker.num_steps += len(steps)
        return True

    def _handoff(self, d: int, ready: float, request: Request) -> None:
        """A prefilled request handed to decode worker ``d`` at ``ready``, s, FIFO; where it could be
        admitted (none waits, a slot free) a pending run is cut before its first step from ``ready``."""
        worker = self.decode[d]
        if worker.pending is not None and not worker.handoffs:
            scheduler = worker.scheduler
            if len(scheduler.running) + len(worker.moving) < scheduler.max_num_seqs:
                worker.take_run(before=ready)
        worker.handoffs.append((ready, request))
        worker.wake(ready)

    def _start(self, worker: _Worker, start: float) -> None:
        output = worker.scheduler.schedule(start)
        if output.is_empty:
            worker.idle = True  # blocked or done: woken by the next request, handoff or freed block
            return
        worker.step = (output, start, worker.clock.step_end(start, StepWork.of(output)))

    def _end(self, worker: _Worker, is_prefill: bool, end: float) -> list[Finished]:
        assert worker.step is not None
        output, start, _ = worker.step
        scheduler = worker.scheduler
        if output is _FINISHING:  # a decode run whose last step finishes requests (_run)
            assert worker.pending is not None
            run, _ = worker.pending
            worker.pending = None
            parts, _ = run.take(len(run.ends))
            worker.parts += parts
            worker.num_steps += len(run.ends)
            finished = scheduler.take_finished()
        else:
            scheduled = output.scheduled
            scheduler.update_from_output(output, dict.fromkeys(map(_REQUEST_ID, scheduled), SIMULATED_TOKEN_ID), end)
            finished = scheduler.take_finished()
            worker.parts.append(scheduler.step_stats(worker.num_steps, start, end, output, len(finished)))
            worker.num_steps += 1
        worker.step, worker.now = None, end
        out = []
        for request in finished:
            if not is_prefill:
                del self._route[request.request_id]
                done = replace(_finished(request), kv_transfer_s=self.transfer_s.pop(request.request_id, None))
                if self.decode_first:  # the prefill worker's token was dropped by the router
                    done = replace(done, token_times=done.token_times[1:], num_output_tokens=done.num_output_tokens - 1)
                out.append(done)
                continue
            _, d, max_tokens = self._route[request.request_id]
            if isinstance(scheduler, DisaggScheduler) and request.request_id in scheduler.held:
                if max_tokens == 1 and not self.decode_first:  # nothing left to decode: no handoff
                    scheduler.release(request.request_id)
                    del self._route[request.request_id]
                    out.append(_finished(request))
                    continue
                if never := _never_fits(self.decode[d].scheduler, request, max_tokens + self.decode_first):
                    scheduler.release(request.request_id)  # as a finished request's: no handoff waits forever
                    del self._route[request.request_id]
                    request.finish_reason, request.finish_detail = FinishReason.CANNOT_FIT, never
                    done = _finished(request)
                    if self.decode_first:  # the prefill worker's token was dropped by the router
                        done = replace(done, token_times=(), num_output_tokens=0)
                    out.append(done)
                    continue
                self._handoff(d, end, request)
            else:  # refused or cut short on the prefill worker (cannot fit): the client's answer
                del self._route[request.request_id]
                out.append(_finished(request))
        return out

    def _admit(self, d: int, start: float) -> None:
        """Decode worker ``d`` at the start of its step: the moved requests join its running set,
        then its handoffs are admitted FIFO while max_num_seqs and its pool allow."""
        worker = self.decode[d]
        scheduler = worker.scheduler
        for moved_at, prefilled in [m for m in worker.moved if m[0] <= start]:
            worker.moved.remove((moved_at, prefilled))
            _join(scheduler, prefilled, self._route[prefilled.request_id][2] + self.decode_first, start)
        while worker.handoffs and worker.handoffs[0][0] <= start:
            prefilled = worker.handoffs[0][1]
            if len(scheduler.running) + len(worker.moving) >= scheduler.max_num_seqs:
                break
            rid = prefilled.request_id
            if not scheduler.block_manager.allocate(rid, prefilled.num_prompt_tokens + 1):
                break
            worker.handoffs.popleft()
            worker.moving[rid] = (start, prefilled)
            self.links[d].start(rid, start, self.transfer_bytes(prefilled.num_prompt_tokens))

    def _moved(self, d: int, at: float) -> None:
        worker = self.decode[d]
        for rid in self.links[d].take_done(at):
            started, prefilled = worker.moving.pop(rid)
            self.transfer_s[rid] = at - started
            p = self._route[rid][0]
            scheduler = self.prefill[p].scheduler
            assert isinstance(scheduler, DisaggScheduler)
            scheduler.release(rid)
            self.prefill[p].wake(at)
            worker.moved.append((at, prefilled))
            worker.wake(at)


def _disagg_scheduler(facts: EngineFacts, hold: bool) -> DisaggScheduler:
    """A worker's scheduler: the bundled disaggregated engine's own (engine.disagg.scheduler: a
    prefill worker holds a finished prefill's blocks until ``release``; a decode worker ``join``s
    a moved request), with the KV pool and limits of ``facts``."""
    scheduler = scheduler_for(facts, cls=DisaggScheduler)
    assert isinstance(scheduler, DisaggScheduler)
    scheduler.hold = hold
    return scheduler


def _never_fits(scheduler: Scheduler, prefilled: Request, max_tokens: int) -> str:
    """Why a handoff can never run on the decode worker of ``scheduler`` ("" when it can): its whole
    length there (prompt + ``max_tokens`` - 1 tokens, the last token needing no slot) needs more
    blocks than the worker's pool or exceeds max_model_len, the aggregated engine's cannot_fit rule
    (engine.scheduler.Scheduler.add_request) applied where the router hands it off; it covers a
    prompt + 1 tokens (admission's need) larger than the pool."""
    length = prefilled.num_prompt_tokens + max_tokens
    if length > scheduler.max_model_len:
        return f"prompt {prefilled.num_prompt_tokens} + max_tokens {max_tokens} = {length} tokens > max_model_len"
    needed, pool = scheduler.block_manager.num_blocks_for(length - 1), scheduler.block_manager.num_blocks
    return f"needs {needed} blocks, the decode worker's cache has {pool}" if needed > pool else ""


def _join(scheduler: Scheduler, prefilled: Request, max_tokens: int, now: float) -> None:
    """A prefilled request whose KV has moved joins ``scheduler``'s running set (its blocks were
    allocated at admission): the whole prompt computed, token 1 its next input, ``max_tokens`` its
    client's."""
    params = replace(prefilled.sampling_params, max_tokens=max_tokens)
    request = Request(
        prefilled.request_id,
        prefilled.prompt_token_ids,
        params,
        prefilled.arrival_time,
        prefilled.cache_salt,
        prefilled.tenant,
        prefilled.prompt_hashes,
    )
    request.output_token_ids = list(prefilled.output_token_ids)
    request.token_times = list(prefilled.token_times)
    request.first_scheduled_time = prefilled.first_scheduled_time
    request.num_cached_tokens = prefilled.num_cached_tokens
    request.num_preemptions = prefilled.num_preemptions
    request.num_computed_tokens = request.num_prompt_tokens
    assert isinstance(scheduler, DisaggScheduler)
    scheduler.join(request, now)  # the engine's rule: running at once, its prompt's full blocks cached
