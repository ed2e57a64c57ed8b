"""Decode runs: a stretch of pure decode steps simulated in one go, equal step for step to the
scheduler stepping them one by one (the scheduler's fast path for a simulation, kvplan's
``SimBackend``, which has no model to run; it lives beside the scheduler and the block manager
whose state it brings forward).

While every running request is decoding (its last sampled token is the one token left to
compute), none finishes, no waiting request can be admitted (none waits, or ``max_num_seqs``
requests run, or their decodes take the whole token budget in a step that mixes them with
prefill chunks; engine.config's ``prefill_first`` admits in steps of their own) and the pool can give every block
the run needs, the scheduler's choice is the same each step: every running request, one token
each, in admission order, a new block for each request whose next token crosses a block
boundary; the waiting ones wait. So ``k`` such
steps can be taken together: per step only the blocks, the clock and the step's stats are
computed; each request's counters, output ids and token times are brought forward once at the
end. A run stops before the step in which a request would finish, before a step an arrival
(``until``) would join, and before a step the free blocks could not supply; the backend then takes
that step through the scheduler itself; with offload tiers on (engine.offload) it stops too before
a step whose block take would evict a cached block (a store), so stores are counted step by step.
The blocks a run takes and the blocks it fills (entered
into the prefix cache with caching on) are settled once after it, as the steps would have left
them (``_settle``)::

    step j of the run (0-based), request i with c_i tokens computed at the run's start:
      computes token c_i + j (one decode token); holds ceil((c_i + j + 1) / block_size) blocks
      context and attended tokens of the step: sum_i (c_i + j + 1)

Exactness is tested against the scheduler stepping alone on random workloads (hypothesis, at
least 200 of them, with preemption, chunked prefill and prefix caching).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engine.block_manager import BlockManager
from engine.outputs import StepStats
from engine.request import Request
from engine.scheduler import Scheduler

MIN_RUN = 2  # fewer steps than this go through the scheduler as usual
SIMULATED_TOKEN_ID = (
    -1
)  # what a simulated request samples: outside every vocabulary, so an output block never hashes like a prompt block


class RunClock(Protocol):
    """Where steps sit on a virtual clock, seconds (kvplan.run.sim.cost.StepClock)."""

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
) -> tuple[list[StepStats], float] | None:
    """The steps of a decode run from ``now`` (see the module docstring) and the clock after it;
    None where no run of at least ``MIN_RUN`` steps can be taken. ``first_index``: the first
    step's index; ``decode_work(n, context)``: the work ``clock.step_end`` times, of a step of
    ``n`` decodes over ``context`` context tokens (seconds are the clock's)."""
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
    ):
        return None  # a waiting request could be admitted (a prefill_first step leaves decodes out of its budget)
    computed: list[int] = []
    room = None
    for r in running:  # the first request that rules a run out ends the look (most steps have one)
        outputs = r.output_token_ids
        done = len(outputs)
        left = r.sampling_params.max_tokens - done  # the step that samples the last one finishes it
        if left <= MIN_RUN or not done or (c := r.num_computed_tokens) != len(r.prompt_token_ids) + done - 1:
            return None  # a finish within MIN_RUN steps, a prefill or a recompute
        room = left - 1 if room is None or left - 1 < room else room
        computed.append(c)
    if room is None:
        return None
    block_size, tables = bm.block_size, bm.block_tables
    ids = tuple(r.request_id for r in running)
    capacity = [len(tables[rid]) * block_size for rid in ids]  # tokens each table holds
    context0 = sum(computed) + n
    # step j -> the requests (in admission order) whose token c_i + j needs a new block then
    due: dict[int, list[int]] = {}
    for i in range(n):
        due.setdefault(max(capacity[i] - computed[i], 0), []).append(i)
    # step j -> the requests whose block fills then: (c_i + j + 1) % block_size == 0
    fills: dict[int, list[int]] = {}
    if bm.enable_prefix_caching:
        for i in range(n):
            fills.setdefault(-(computed[i] + 1) % block_size, []).append(i)
    num_waiting = len(scheduler.waiting)
    tenants: dict[str, Any] = {}
    if scheduler.admission is not None:
        tenants.update(scheduler.admission.tenant_columns())
    if bm.offload is not None:  # a run stores and loads nothing: the tiers hold what they held
        tenants = {
            **tenants,
            "num_host_blocks": bm.offload.num_blocks("host"),
            "num_disk_blocks": bm.offload.num_blocks("disk"),
        }
    # blocks taken and filled blocks are settled after the run (_settle), as the steps would have
    grown: list[tuple[int, list[str]]] = []  # (step, a request id per block taken then, in order)
    filled: list[tuple[int, list[int]]] = []  # (step, the requests whose block filled then)
    free, used = bm.num_free_blocks, bm.num_used_blocks
    # offload tiers on: a step whose take would evict a cached block (a store) is the scheduler's
    unevicting = bm.num_takeable_without_eviction() if bm.offload is not None else free
    steps: list[StepStats] = []
    ends: list[float] = []
    for j in range(room):
        check, start = clock.next_start(now)
        if until is not None and until <= check:
            break
        grow = due.get(j, ())
        if len(grow) > free:
            break  # the scheduler would preempt: it takes this step itself
        if len(grow) > unevicting:
            break  # it would store an evicted block in a lower tier: counted in a step of its own
        if grow:
            grow = sorted(grow)  # in admission order, as the scheduler allocates
            grown.append((j, [ids[i] for i in grow]))
            free -= len(grow)
            unevicting -= len(grow)
            used += len(grow)
            later = due.setdefault(j + block_size, [])
            for i in grow:
                capacity[i] += block_size
            later += grow
            del due[j]
        context = context0 + n * j
        end = clock.step_end(start, decode_work(n, context))
        full = fills.pop(j, None)
        if full:  # as update_from_output offers a filled block, in admission order (each list ascends:
            # a request's fills are block_size steps apart, all first fills within the first block_size)
            filled.append((j, full))
            fills[j + block_size] = full[:]
        steps.append(
            StepStats(
                step_index=first_index + j,
                start_time=start,
                end_time=end,
                num_prefill_tokens=0,
                num_decode_tokens=n,
                num_running=n,
                num_waiting=num_waiting,
                num_used_blocks=used,
                num_free_blocks=free,
                num_total_blocks=bm.num_blocks,
                num_preemptions=0,
                num_finished=0,
                num_oom=0,
                kv_resident_tokens=tuple(map((j + 1).__add__, computed)),
                kv_resident_request_ids=ids,
                num_prefix_queried_tokens=0,
                num_prefix_hit_tokens=0,
                num_peak_used_blocks=used,
                num_prefill_seqs=0,
                num_context_tokens=context,
                num_attended_tokens=context,
                num_decode_context_tokens=context,
                **tenants,
            )
        )
        ends.append(end)
        now = end
    if not steps:
        return None
    k = len(steps)
    for r, c in zip(running, computed):
        _bring_forward(r, c + k)
        r.token_times.extend(ends)
    if grown or filled:
        _settle(bm, running, computed, grown, filled, k)
    scheduler._blocks_held = bm.num_used_blocks  # as schedule() leaves it after its last step
    return steps, now


def _settle(
    bm: BlockManager,
    running: list[Request],
    computed: list[int],
    grown: list[tuple[int, list[str]]],
    filled: list[tuple[int, list[int]]],
    k: int,
) -> None:
    """Take the run's blocks and offer its filled blocks to the prefix cache, leaving the block
    manager as the run's ``k`` steps would have, each taking its blocks (``grown``) and then
    offering the blocks it filled (``filled``). Taking blocks never touches a filled block's
    cache entry unless it evicts a cached block of the same hash, so where none of the evicted
    hashes is a filled block's, all blocks are taken first (one call) and the filled blocks
    offered after (``_cache_filled``); else step by step, in the steps' order."""
    taken = [rid for _, ids in grown for rid in ids]
    evicted = bm.hashes_evicted_by(len(taken)) if filled else set()
    if evicted and any(
        h in evicted for i in {i for _, full in filled for i in full} for h in bm.uncached_hashes(running[i])
    ):
        grows, fills = dict(grown), dict(filled)  # each step at most once in either
        for j in sorted(grows.keys() | fills.keys()):
            if j in grows:
                assert bm.append_blocks(grows[j])
            for i in fills.get(j, ()):
                running[i].num_computed_tokens = computed[i] + j + 1
                bm.cache_computed_blocks(running[i])
        for i, r in enumerate(running):
            r.num_computed_tokens = computed[i] + k
        return
    if taken:
        assert bm.append_blocks(taken)
    if filled:
        _cache_filled(bm, running, computed, filled, k)


def _cache_filled(
    bm: BlockManager, running: list[Request], computed: list[int], filled: list[tuple[int, list[int]]], k: int
) -> None:
    """Offer the prefix cache the blocks a deferred run filled (``filled``: per step, the requests,
    by position in ``running``, whose block filled then; each request already brought forward by
    the run's ``k`` steps from ``computed``), as the steps would have offered them. Per request in
    one call where no two of them can hash a block alike (their first blocks differ in tokens or
    salt: a block's hash chains over every block before it); else step by step, in the order the
    steps offered them."""
    block_size = bm.block_size
    which = sorted({i for _, full in filled for i in full})
    heads = {(running[i].cache_salt, running[i].token_ids_between(0, block_size)) for i in which}
    if len(heads) == len(which):
        for i in which:
            bm.cache_computed_blocks(running[i])
        return
    for j, full in filled:
        for i in full:
            running[i].num_computed_tokens = computed[i] + j + 1
            bm.cache_computed_blocks(running[i])
    for i in which:
        running[i].num_computed_tokens = computed[i] + k


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
