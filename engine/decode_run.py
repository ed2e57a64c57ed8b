"""Decode runs: a stretch of pure decode steps simulated in one go, equal step for step to the
scheduler stepping them one by one (the scheduler's fast path for a simulation, kvplan's
``SimBackend``, which has no model to run; it lives beside the scheduler and the block manager
whose state it brings forward).

While every running request is decoding (its last sampled token is the one token left to
compute), none finishes, no waiting request can be admitted (none waits, or ``max_num_seqs``
requests run, or their decodes take the whole token budget in a step that mixes them with
prefill chunks; engine.config's ``prefill_first`` admits in steps of their own; or, without
prefix caching, admission control and tiers, the first waiting one needs more blocks than are
free: a preempted request while the pool is full) and the pool can give every block
the run needs, the scheduler's choice is the same each step: every running request, one token
each, in admission order, a new block for each request whose next token crosses a block
boundary; the waiting ones wait. So ``k`` such
steps can be taken together, with no work per step but each step's times: request i takes a
block at steps ``first_i + m x block_size``, so how many blocks each step takes, and the step that
would take more than the pool gives, follow from each request's first; the clock gives the run's
step times in one call where it can (``decode_times``: the step-time model over the run's
contexts at once); the steps come back as one ``engine.outputs.DecodeRunSteps`` (each step's
StepStats built only where it is read); each request's counters, output ids and token times are
brought forward once at the end. A run stops before the step in which a request would finish (planned
with ``finish``, without prefix caching, it ends with that step instead: a disaggregated decode
worker's, kvplan.run.sim.disagg), before a step an arrival
(``until``) would join, and before a step the free blocks could not supply; the backend then takes
that step through the scheduler itself; with offload tiers on (engine.offload) it stops too before
a step whose block take would evict a cached block (a store), so stores are counted step by step.
The blocks a run takes and the blocks it fills (entered
into the prefix cache with caching on) are settled once after it, as the steps would have left
them (engine.run_settle)::

    step j of the run (0-based), request i with c_i tokens computed at the run's start:
      computes token c_i + j (one decode token); holds ceil((c_i + j + 1) / block_size) blocks
      context and attended tokens of the step: sum_i (c_i + j + 1)

Exactness is tested against the scheduler stepping alone on random workloads (hypothesis, at
least 200 of them, with preemption, chunked prefill and prefix caching).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any, Protocol

from engine.outputs import DecodeRunSteps, StepStats
from engine.request import FinishReason, Request
from engine.run_settle import settle
from engine.scheduler import Scheduler

MIN_RUN = 2  # fewer steps than this go through the scheduler as usual
SIMULATED_TOKEN_ID = (
    -1
)  # what a simulated request samples: outside every vocabulary, so an output block never hashes like a prompt block


class RunClock(Protocol):
    """Where steps sit on a virtual clock, seconds (kvplan.run.sim.cost.StepClock). A clock may also
    have ``decode_times(now, n, context0, k)``: the (checks, starts, ends) of ``k`` decode-only
    steps after ``now`` (step j: ``n`` decodes over ``context0 + n x j`` context tokens), each
    equal to what ``next_start`` and ``step_end`` give step by step (kvplan.run.sim.cost.ModelClock),
    or None where only step by step will do (a clock drawing a residual per step taken); a run
    then asks it once per stretch instead of twice per step."""

    def next_start(self, now: float) -> tuple[float, float]:
        """For the step after ``now``: (the time up to which arrivals join it, its start)."""

    def step_end(self, start: float, work: Any) -> float:
        """When a step of ``work`` (what ``decode_work`` made) that started at ``start`` ends."""


def decode_run(
    scheduler: Scheduler,
    clock: RunClock,
    now: float,
    until: float | None,
    first_index: int,
    decode_work: Callable[[int, int], Any],
    checks: list[float] | None = None,
) -> tuple[DecodeRunSteps, float] | None:
    """The steps of a decode run from ``now`` (see the module docstring) and the clock after it;
    None where no run of at least ``MIN_RUN`` steps can be taken. ``first_index``: the first
    step's index; ``decode_work(n, context)``: the work ``clock.step_end`` times, of a step of
    ``n`` decodes over ``context`` context tokens (seconds are the clock's). The steps come as a
    ``DecodeRunSteps``: each step's StepStats is built where it is read. ``checks``: a list to
    which each step's check time (up to which arrivals join it, s) is appended."""
    run = plan_decode_run(scheduler, clock, now, until, first_index, decode_work)
    if run is None:
        return None
    if checks is not None:
        checks += run.checks
    (steps,), end = run.take(len(run.ends))  # planned without finish: one DecodeRunSteps
    assert isinstance(steps, DecodeRunSteps)
    return steps, end


class PlannedRun:
    """A decode run timed but not yet taken (``plan_decode_run``): its steps' ``starts``, ``ends``
    and ``checks`` (s), and ``take(k)``, which brings the scheduler forward by the first ``k`` of
    them (1 <= k <= len(ends)), exactly as ``decode_run`` takes a run of ``k`` steps. Between the
    plan and the take nothing may change the scheduler, its requests or its block manager (a
    disaggregated decode worker's run, cut short where a handoff arrives: kvplan.run.sim.disagg).
    ``finish_at``: where planned with ``finish``, the run's length when its last step is the one
    in which the requests nearest their ``max_tokens`` sample their last token (None otherwise);
    taking that many steps finishes them as that step's update would."""

    __slots__ = ("scheduler", "first_index", "computed", "firsts", "starts", "ends", "checks", "finish_at")

    def __init__(
        self,
        scheduler: Scheduler,
        first_index: int,
        computed: list[int],
        firsts: list[int],
        times: tuple,
        finish_at: int | None = None,
    ):
        self.scheduler, self.first_index, self.computed, self.firsts = scheduler, first_index, computed, firsts
        self.starts, self.ends, self.checks = times
        self.finish_at = finish_at

    def take(self, k: int) -> tuple[list[DecodeRunSteps | StepStats], float]:
        """The run's first ``k`` steps taken: (their steps, the end of the last, s). The steps are
        one ``DecodeRunSteps``; where ``k`` is ``finish_at``, the last step is instead the
        ``StepStats`` of the step that finished requests (``Scheduler.step_stats`` after its
        update, as stepping gives it), after a ``DecodeRunSteps`` of the others, if any."""
        scheduler, computed = self.scheduler, self.computed
        running, bm = scheduler.running, scheduler.block_manager
        block_size = bm.block_size
        finishing = k == self.finish_at
        plain = k - 1 if finishing else k  # the steps a DecodeRunSteps describes
        ends = self.ends[:k]
        ids = tuple(r.request_id for r in running)
        taken_steps, order = _taken(self.firsts, block_size, k)
        parts: list[DecodeRunSteps | StepStats] = []
        if plain:
            columns: dict[str, Any] = {}
            if scheduler.admission is not None:
                columns.update(scheduler.admission.tenant_columns())
            if bm.offload is not None:  # a run stores and loads nothing: the tiers hold what they held
                columns["num_host_blocks"] = bm.offload.num_blocks("host")
                columns["num_disk_blocks"] = bm.offload.num_blocks("disk")
            counts = (len(scheduler.waiting), bm.num_used_blocks, bm.num_free_blocks, bm.num_blocks)
            in_plain = taken_steps if plain == k else taken_steps[: bisect_left(taken_steps, plain)]
            starts = self.starts[:plain]
            parts.append(
                DecodeRunSteps(self.first_index, starts, ends[:plain], computed, ids, counts, in_plain, columns)
            )
        sampled = [SIMULATED_TOKEN_ID] * k  # each step samples one token a request (the precondition)
        for r, c in zip(running, computed):
            if r.sampling_params.forced_token_ids is None:  # _bring_forward's common case, inline
                r.num_computed_tokens = c + k
                r.output_token_ids.extend(sampled)
            else:
                _bring_forward(r, c + k)
            r.token_times.extend(ends)
        # the blocks taken and the blocks filled are settled after the run, as the steps would have left them
        fills = [-(c + 1) % block_size for c in computed] if bm.enable_prefix_caching else []
        if order or any(f < k for f in fills):
            settle(bm, running, computed, (taken_steps, [ids[i] for i in order]), fills, k)
        scheduler._blocks_held = bm.num_used_blocks  # as schedule() leaves it after its last step
        if finishing:
            parts.append(self._finish(k))
        return parts, ends[-1]

    def _finish(self, k: int) -> StepStats:
        """Finish the requests whose last token step ``k - 1`` sampled (in admission order, as
        ``Scheduler.update_from_output``: stop where it is an end-of-sequence id that counts, else
        length) and that step's stats, read after its update as stepping reads them."""
        scheduler, n = self.scheduler, len(self.computed)
        start, end = self.starts[k - 1], self.ends[k - 1]
        eos = scheduler.eos_token_ids
        done = [r for r in scheduler.running if len(r.output_token_ids) >= r.sampling_params.max_tokens]
        for r in done:
            params, outputs = r.sampling_params, r.output_token_ids
            stop = outputs[-1] in eos and not params.ignore_eos and len(outputs) >= params.min_tokens
            scheduler._finish(r, FinishReason.STOP if stop else FinishReason.LENGTH, end)
        context = sum(self.computed) + n * k  # each decode reads its c_i + k tokens
        work = _DecodeWork(n, context)
        return scheduler.step_stats(self.first_index + k - 1, start, end, work, len(done))  # type: ignore[arg-type]


class _DecodeWork:
    """What ``Scheduler.step_stats`` reads of a ``SchedulerOutput``, for a step of ``n`` decodes
    over ``context`` context tokens (no prefill, preemption or prefix lookup)."""

    num_prefill_tokens = num_prefill_seqs = num_prefix_queried_tokens = num_prefix_hit_tokens = 0
    preempted_request_ids: tuple[str, ...] = ()
    residents = None

    def __init__(self, n: int, context: int):
        self.num_decode_tokens = n
        self.num_context_tokens = self.num_attended_tokens = self.num_decode_context_tokens = context


def plan_decode_run(
    scheduler: Scheduler,
    clock: RunClock,
    now: float,
    until: float | None,
    first_index: int,
    decode_work: Callable[[int, int], Any],
    finish: bool = False,
) -> PlannedRun | None:
    """``decode_run``'s run timed, its steps not yet taken (``PlannedRun.take``); None where
    ``decode_run`` gives None. Arguments as ``decode_run``'s. ``finish``: the run may go on to
    the step in which the requests nearest their ``max_tokens`` finish, its last (``finish_at``),
    instead of stopping before it; only without prefix caching (a finish frees blocks between the
    step's block fills, which stepping offers to the prefix cache in request order)."""
    running = scheduler.running
    bm = scheduler.block_manager
    if scheduler.has_untaken_finished() or not running:
        return None
    n = len(running)
    if n > scheduler.max_num_batched_tokens:
        return None
    if (
        scheduler.waiting
        and n < scheduler.max_num_seqs
        and (scheduler.prefill_first or n < scheduler.max_num_batched_tokens)
        and not _head_never_admitted(scheduler)
    ):
        return None  # a waiting request could be admitted (a prefill_first step leaves decodes out of its budget)
    computed: list[int] = []
    finish = finish and not bm.enable_prefix_caching
    near = MIN_RUN if not finish else 0  # a finish this near ends the look (none: a run may finish it)
    least = None
    for r in running:  # the first request that rules a run out ends the look (most steps have one)
        outputs = r.output_token_ids
        done = len(outputs)
        left = r.sampling_params.max_tokens - done  # the step that samples the last one finishes it
        if left <= near or not done or (c := r.num_computed_tokens) != len(r.prompt_token_ids) + done - 1:
            return None  # a finish within MIN_RUN steps, a prefill or a recompute
        least = left if least is None or left < least else least
        computed.append(c)
    if least is None:
        return None
    room = least if finish else least - 1  # with finish: up to the step that finishes the nearest
    block_size, tables = bm.block_size, bm.block_tables
    # step of each request's first new block: its token c_i + j needs one when c_i + j fills its table
    firsts = [max(len(tables[r.request_id]) * block_size - c, 0) for r, c in zip(running, computed)]
    free = bm.num_free_blocks
    # offload tiers on: a step whose take would evict a cached block (a store) is the scheduler's
    unevicting = bm.num_takeable_without_eviction() if bm.offload is not None else free
    spare = min(free, unevicting)  # a step that would take more blocks than these ends the run
    supplied = room  # the steps the pool supplies: up to the one that takes block spare + 1
    if _num_taken(firsts, block_size, room - 1) > spare:
        supplied = _taken(firsts, block_size, room)[0][spare]
    checks: list[float] = []
    times = _step_times(clock, now, until, n, sum(computed) + n, (room, supplied), decode_work, checks)
    if times is None:
        return None
    return PlannedRun(scheduler, first_index, computed, firsts, (*times, checks), room if finish else None)


def _head_never_admitted(scheduler: Scheduler) -> bool:
    """Whether the first waiting request cannot be admitted in any step of a run from now: its
    first chunk (its tokens, up to the step's budget left after the decodes: the whole budget in a
    prefill_first step) needs more blocks than are free now, and a run only takes blocks. Only
    without prefix caching (a block a run fills could shorten its need), admission control and
    offload tiers; False otherwise."""
    bm = scheduler.block_manager
    if bm.enable_prefix_caching or scheduler.admission is not None or bm.offload is not None:
        return False
    budget = scheduler.max_num_batched_tokens - (0 if scheduler.prefill_first else len(scheduler.running))
    return -(-min(scheduler.waiting[0].num_tokens, budget) // bm.block_size) > bm.num_free_blocks


def _num_taken(firsts: list[int], block_size: int, j: int) -> int:
    """Blocks the run's steps 0..``j`` take: request i one at steps ``firsts[i] + m x block_size``."""
    return sum((j - f) // block_size + 1 for f in firsts if f <= j)


def _taken(firsts: list[int], block_size: int, k: int) -> tuple[list[int], list[int]]:
    """The blocks steps 0..``k - 1`` take, in the order the steps take them (by step, and within a
    step in admission order, as the scheduler allocates): the step of each and its request's
    position in ``running``. Request i takes one at steps ``firsts[i] + m x block_size``; where
    every first step is below ``block_size`` (a table filled up to its last block, the common
    case), each stretch of ``block_size`` steps takes them in one order."""
    if any(f >= block_size for f in firsts):
        events = sorted((f + m * block_size, i) for i, f in enumerate(firsts) for m in range(-(-(k - f) // block_size)))
        return [j for j, _ in events], [i for _, i in events]
    order = sorted(range(len(firsts)), key=firsts.__getitem__)  # stable: by step, then admission order
    ordered = [firsts[i] for i in order]
    steps: list[int] = []
    who: list[int] = []
    for base in range(0, k, block_size):
        cut = len(order) if base + block_size <= k else bisect_left(ordered, k - base)
        steps += [f + base for f in ordered[:cut]]
        who += order[:cut]
    return steps, who


def _step_times(
    clock: RunClock,
    now: float,
    until: float | None,
    n: int,
    context0: int,
    limits: tuple[int, int],
    decode_work: Callable,
    checks_out: list[float] | None = None,
) -> tuple[list[float], list[float]] | None:
    """The starts and ends of the run's steps: fewer than both ``limits`` (the steps before a
    request would finish, the steps the pool supplies blocks for), each before the arrival at
    ``until`` would join it (None: not one step); each step's check appended to ``checks_out``."""
    times: Callable | None = getattr(clock, "decode_times", None)
    room = min(limits)
    size = room if until is None else min(room, 64)  # cut at an arrival: stretches of doubling length
    got = None if times is None else times(now, n, context0, size)
    if got is None:  # step by step, asking the clock as the run's loop always has
        starts: list[float] = []
        ends: list[float] = []
        for j in range(limits[0]):
            check, start = clock.next_start(now)
            if (until is not None and until <= check) or j == limits[1]:
                break
            now = clock.step_end(start, decode_work(n, context0 + n * j))
            starts.append(start)
            ends.append(now)
            if checks_out is not None:
                checks_out.append(check)
        return (starts, ends) if ends else None
    starts, ends = [], []
    while True:
        checks, more_starts, more_ends = got
        cut = size if until is None else bisect_left(checks, until)  # checks only grow: the first step it joins
        starts += more_starts[:cut]
        ends += more_ends[:cut]
        if checks_out is not None:
            checks_out += checks[:cut]
        if cut < size or len(ends) >= room:
            break
        now, size = ends[-1], min(size * 2, room - len(ends))
        got = times(now, n, context0 + n * len(ends), size) if times is not None else None
        assert got is not None  # a clock that timed the first stretch times every one
    return (starts, ends) if ends else None


def _bring_forward(request: Request, num_computed: int) -> None:
    """``request`` as the scheduler leaves it once it has computed ``num_computed`` tokens by
    decode steps: that many computed, and an output id sampled by each of those steps (its
    replayed reply's, ``forced_token_ids``, while it lasts; else ``SIMULATED_TOKEN_ID``). Its
    token times are the caller's."""
    request.num_computed_tokens = num_computed
    outputs, forced = request.output_token_ids, request.sampling_params.forced_token_ids
    want = num_computed + 1 - request.num_prompt_tokens  # the last computed token is the last sampled one
    have = len(outputs)
    if forced is not None and have < len(forced):
        own = forced[have:want]
        outputs.extend(own)
        have += len(own)
    if have < want:
        outputs.extend([SIMULATED_TOKEN_ID] * (want - have))
