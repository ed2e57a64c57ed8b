"""Decode runs: a stretch of pure decode steps simulated in one go, equal step for step to the
engine's scheduler stepping them one by one.

While no request waits, every running request is decoding (its last sampled token is the one
token left to compute), none finishes and the pool can give every block the run needs, the
scheduler's choice is the same each step: every running request, one token each, in admission
order, a new block for each request whose next token crosses a block boundary. So ``k`` such
steps can be taken together: per step only the blocks, the clock and the step's stats are
computed; each request's counters, output ids and token times are brought forward once at the
end. A run stops before the step in which a request would finish, before a step an arrival
(``until``) would join, and before a step the free blocks could not supply; the backend then takes
that step through the scheduler itself. With prefix caching on, filling a block enters it into
the cache, so runs are not taken there (the scheduler steps as usual)::

    step j of the run (0-based), request i with c_i tokens computed at the run's start:
      computes token c_i + j (one decode token); holds ceil((c_i + j + 1) / block_size) blocks
      context and attended tokens of the step: sum_i (c_i + j + 1)

Exactness is tested against the scheduler stepping alone on random workloads (hypothesis, at
least 200 of them, with preemption, chunked prefill and prefix caching).
"""

from __future__ import annotations

from engine.outputs import StepStats
from engine.scheduler import Scheduler
from kvplan.run.sim.cost import StepClock, StepWork

MIN_RUN = 2  # fewer steps than this go through the scheduler as usual
SIMULATED_TOKEN_ID = (
    -1
)  # what a simulated request samples: outside every vocabulary, so an output block never hashes like a prompt block


def decode_run(
    scheduler: Scheduler, clock: StepClock, now: float, until: float | None, first_index: int
) -> tuple[list[StepStats], float] | None:
    """The steps of a decode run from ``now`` (see the module docstring) and the clock after it;
    None where no run of at least ``MIN_RUN`` steps can be taken. ``first_index``: the first
    step's index."""
    running = scheduler.running
    bm = scheduler.block_manager
    if scheduler.waiting or scheduler.has_untaken_finished() or not running or bm.enable_prefix_caching:
        return None
    n = len(running)
    if n > scheduler.max_num_batched_tokens:
        return None
    computed, room = [], None
    for r in running:
        outputs = r.output_token_ids
        if not outputs or r.num_computed_tokens != r.num_prompt_tokens + len(outputs) - 1:
            return None  # a prefill or a recompute
        left = r.sampling_params.max_tokens - len(outputs)  # the step that samples the last one finishes it
        room = left - 1 if room is None else min(room, left - 1)
        computed.append(r.num_computed_tokens)
    if room is None or room < MIN_RUN:
        return None
    block_size, tables = bm.block_size, bm.block_tables
    ids = tuple(r.request_id for r in running)
    capacity = [len(tables[rid]) * block_size for rid in ids]  # tokens each table holds
    context0 = sum(computed) + n
    # step j -> the requests (in admission order) whose token c_i + j needs a new block then
    due: dict[int, list[int]] = {}
    for i in range(n):
        due.setdefault(max(capacity[i] - computed[i], 0), []).append(i)
    steps: list[StepStats] = []
    ends: list[float] = []
    for j in range(room):
        check, start = clock.next_start(now)
        if until is not None and until <= check:
            break
        grow = due.get(j, ())
        if len(grow) > bm.num_free_blocks:
            break  # the scheduler would preempt: it takes this step itself
        if grow:
            grow = sorted(grow)  # in admission order, as the scheduler allocates
            assert bm.append_blocks([ids[i] for i in grow])
            later = due.setdefault(j + block_size, [])
            for i in grow:
                capacity[i] += block_size
            later += grow
            del due[j]
        context = context0 + n * j
        end = clock.step_end(start, StepWork(0, n, 0, context, context, context))
        used = bm.num_used_blocks
        steps.append(
            StepStats(
                step_index=first_index + j,
                start_time=start,
                end_time=end,
                num_prefill_tokens=0,
                num_decode_tokens=n,
                num_running=n,
                num_waiting=0,
                num_used_blocks=used,
                num_free_blocks=bm.num_free_blocks,
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
            )
        )
        ends.append(end)
        now = end
    if not steps:
        return None
    k = len(steps)
    tokens = [SIMULATED_TOKEN_ID] * k
    for r in running:
        r.num_computed_tokens += k
        outputs, forced = r.output_token_ids, r.sampling_params.forced_token_ids
        if forced is not None and len(outputs) < len(forced):  # a replayed reply, as the scheduler emits it
            own = forced[len(outputs) : len(outputs) + k]
            outputs.extend(own)
            outputs.extend(tokens[len(own) :])
        else:
            outputs.extend(tokens)
        r.token_times.extend(ends)
    scheduler._blocks_held = bm.num_used_blocks  # as schedule() leaves it after its last step
    return steps, now
