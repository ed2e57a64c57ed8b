"""One step whose running requests all decode, taken without a ``ScheduledRequest`` per decode:
a simulation's fast path (kvplan's ``SimBackend``) for the steps between decode runs
(engine.decode_run), where short outputs finish a request almost every step so the next step
admits one, equal to ``Scheduler.schedule`` then ``update_from_output`` on the same state.

Where every running request has exactly its last sampled token left to compute (a decode), they
number no more than the token budget, and the free blocks cover every decode whose next token
starts a new block, ``schedule`` gives each one token in admission order, takes those blocks in
that order (no preemption: each takes one block, and there are enough), then admits waiting
requests as usual (``Scheduler._admit_waiting``, with the budget the decodes left). This module
checks that in a first pass that changes nothing (else None: the scheduler takes the step
itself), takes the blocks and admits (``schedule``), and after the caller has timed the step from
its counts (``DecodeStep``: the ``SchedulerOutput`` counts a step-time model and ``step_stats``
read), brings each decode forward as ``update_from_output`` would (one computed token, a full
block offered to the prefix cache, the sampled or replayed token, its time, the finish), then
updates the admitted requests through ``update_from_output`` itself, in the same order as one
call would (decodes first, in admission order). Off with ``prefill_first`` (its steps are split in
passes) and with admission limits or offload tiers (their books are kept per scheduled request).

Exactness is tested with decode runs (the backend's ``decode_runs`` switches both): the
hypothesis tests of tests/kvplan/run/sim/test_decode_runs.py compare every step's stats, every
finished request and the block manager's final state with the scheduler stepping alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from engine.outputs import ScheduledRequest, SchedulerOutput
from engine.request import FinishReason
from engine.scheduler import Scheduler


class DecodeStep(NamedTuple):
    """A step of decodes (``decoding``: the running requests, all of them, in admission order)
    plus the requests admitted after them (``admitted``: their part of a ``SchedulerOutput``, with
    its own counts); the counts are the whole step's, as ``SchedulerOutput`` would give them."""

    decoding: tuple
    admitted: SchedulerOutput
    num_prefill_tokens: int
    num_decode_tokens: int
    num_decode_context_tokens: int
    num_context_tokens: int
    num_attended_tokens: int
    num_prefix_queried_tokens: int
    num_prefix_hit_tokens: int

    preempted_request_ids: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return False  # at least one decode

    @property
    def num_prefill_seqs(self) -> int:
        return len(self.admitted.scheduled) - self.admitted.num_decode_tokens

    @property
    def admitted_ids(self) -> list[str]:
        return [s.request_id for s in self.admitted.scheduled]


def schedule_decodes(scheduler: Scheduler, now: float) -> DecodeStep | None:
    """``scheduler.schedule(now)`` where every running request decodes (see the module's doc), as a
    ``DecodeStep``; None, changing nothing, where that does not hold or the scheduler's
    ``prefill_first``, admission limits or offload tiers are on."""
    running, bm = scheduler.running, scheduler.block_manager
    budget = scheduler.max_num_batched_tokens
    if not running or len(running) > budget or scheduler.prefill_first:
        return None
    if scheduler.admission is not None or bm.offload is not None:
        return None
    tables, block_size = bm.block_tables, bm.block_size
    context = 0
    growing: list[tuple[str, int]] = []
    for request in running:
        start = request.num_computed_tokens
        num_prompt = len(request.prompt_token_ids)
        if start < num_prompt or num_prompt + len(request.output_token_ids) - start != 1:
            return None  # a prefill chunk or a recompute
        if start >= len(tables[request.request_id]) * block_size:
            growing.append((request.request_id, start + 1))
        context += start + 1
    if len(growing) > bm.num_free_blocks:
        return None  # some decode could preempt
    allocate = bm.allocate
    for request_id, end in growing:  # in admission order, as _schedule_running's _make_room
        allocate(request_id, end)
    queried0, hit0 = scheduler.num_prefix_queried_tokens, scheduler.num_prefix_hit_tokens
    scheduled: list[ScheduledRequest] = []
    num_running = len(running)
    budget, num_decode, decode_context = scheduler._admit_waiting(
        now, budget - num_running, num_running, context, scheduled
    )
    scheduler._blocks_held = bm.num_used_blocks
    admitted = SchedulerOutput(
        scheduled=tuple(scheduled),
        num_prefill_tokens=scheduler.max_num_batched_tokens - budget - num_decode,
        num_decode_tokens=num_decode - num_running,
        num_decode_context_tokens=decode_context - context,
    )
    return DecodeStep(
        tuple(running[:num_running]),
        admitted,
        admitted.num_prefill_tokens,
        num_decode,
        decode_context,
        context + admitted.num_context_tokens,
        context + admitted.num_attended_tokens,  # a decode attends its whole context: c + 1 pairs
        scheduler.num_prefix_queried_tokens - queried0,
        scheduler.num_prefix_hit_tokens - hit0,
    )


def update_decodes(
    scheduler: Scheduler, step: DecodeStep, sampled: Mapping[str, int], token_id: int, now: float
) -> None:
    """``scheduler.update_from_output`` for ``step`` ended at ``now``: each decode samples
    ``token_id`` (or its replayed reply's next token), the admitted requests ``sampled``'s."""
    bm, eos_token_ids = scheduler.block_manager, scheduler.eos_token_ids
    block_size, finish = bm.block_size, scheduler._finish
    for request in step.decoding:
        before = request.num_computed_tokens
        request.num_computed_tokens = after = before + 1
        if after // block_size != before // block_size:  # a block filled: offer it to the prefix cache
            bm.cache_computed_blocks(request)
        outputs = request.output_token_ids
        params = request.sampling_params
        forced = params.forced_token_ids
        sample = forced[len(outputs)] if forced is not None and len(outputs) < len(forced) else token_id
        outputs.append(sample)
        request.token_times.append(now)
        if sample in eos_token_ids and not params.ignore_eos and len(outputs) >= params.min_tokens:
            finish(request, FinishReason.STOP, now)
        elif len(outputs) >= params.max_tokens:
            finish(request, FinishReason.LENGTH, now)
    if step.admitted.scheduled:
        scheduler.update_from_output(step.admitted, sampled, now)
