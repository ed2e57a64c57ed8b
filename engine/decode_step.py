"""Steps whose running requests all decode, taken without a ``ScheduledRequest`` per decode nor a
pass over the running requests: a simulation's fast path (kvplan's ``SimBackend``) for the steps
between decode runs (engine.decode_run), where short outputs finish a request almost every step
so the next step admits one; each step equal to ``Scheduler.schedule`` then
``update_from_output`` on the same state.

Where every running request but the last has exactly its last sampled token left to compute (a
decode) and the last one decodes too or is in its prefill (a prompt chunk, a recompute), those
decodes number less than the token budget, and the free blocks cover both every decode whose next
token starts a new block and the prefill's chunk, ``schedule`` gives each decode one token in
admission order, takes their blocks in that order (no preemption: there are enough), gives the
prefill its chunk (``Scheduler._schedule_running`` on it alone), then admits waiting requests as
usual (``Scheduler._admit_waiting``, with the budget left). ``update_from_output`` then brings each
decode forward by one token (a full block offered to the prefix cache, the sampled or replayed
token, its time, the finish at ``max_tokens``) and the prefill and the admitted requests by theirs.

``DecodeBatch`` keeps that state across steps instead of reading it off each request every step:
a decode that joined the batch at step ``e`` with ``c`` tokens computed has ``c + j - e`` computed
at step ``j``, takes a block at the steps where that is a multiple of ``block_size`` (its table is
full: a bucket per step modulo ``block_size``), fills one a step earlier, and finishes at step
``e + max_tokens - len(outputs) - 1``. So a step costs the blocks taken, the admissions and the
finishes, not the running requests. A decode's counters, output ids and token times are brought
forward (``sync``) when it finishes, when its block fills with prefix caching on (the cache hashes
its tokens), and for all of them when the batch ends (``settle``): before any step the scheduler
takes itself and before a decode run. The prefill and the admitted requests are the scheduler's
own (``update_from_output``); one that then decodes joins the batch. Off with ``prefill_first``
(its steps are split in passes), admission limits or offload tiers (their books are kept per
scheduled request) and end-of-sequence ids (a simulation has none: its requests end at
``max_tokens``).

Exactness is tested with decode runs (the backend's ``decode_runs`` switches both): the
hypothesis tests of tests/kvplan/run/sim/test_decode_runs.py compare every step's stats, every
finished request and the block manager's final state with the scheduler stepping alone.
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import repeat
from operator import add, attrgetter
from typing import NamedTuple

from engine.decode_run import _bring_forward
from engine.outputs import ScheduledRequest, SchedulerOutput
from engine.request import FinishReason, Request, RequestStatus
from engine.scheduler import Scheduler

_REQUEST_ID = attrgetter("request_id")
# a decode run (engine.decode_run) is taken only where no decode finishes for this many steps: a
# shorter stretch costs the batch less than settling it, the run's own pass and a new batch after
RUN_AHEAD = 16


class DecodeStep(NamedTuple):
    """A step of decodes (every running request's, but a prefill's) plus the requests scheduled
    after them (``admitted``: the prefill's chunk and the admitted requests, a ``SchedulerOutput``
    with its own counts); the counts are the whole step's, as ``SchedulerOutput`` would give them."""

    admitted: SchedulerOutput
    num_prefill_tokens: int
    num_decode_tokens: int
    num_decode_context_tokens: int
    num_context_tokens: int
    num_attended_tokens: int
    num_prefix_queried_tokens: int
    num_prefix_hit_tokens: int

    preempted_request_ids: tuple[str, ...] = ()
    # the requests holding blocks after the step and their computed tokens (Scheduler.kv_residents),
    # set by DecodeBatch.update: Scheduler.step_stats reads them
    residents: tuple[tuple[str, ...], tuple[int, ...]] | None = None

    @property
    def is_empty(self) -> bool:
        return False  # at least one decode

    @property
    def num_prefill_seqs(self) -> int:
        return len(self.admitted.scheduled) - self.admitted.num_decode_tokens


class DecodeBatch:
    """The decoding requests of ``scheduler`` kept as a batch across steps (see the module's doc).
    ``schedule`` and ``update`` take one step; ``settle`` brings every request forward and ends
    the batch (call it before the scheduler or anything else reads the running requests)."""

    def __init__(self, scheduler: Scheduler, residents: bool = True):
        self.scheduler = scheduler
        self.active = False
        # residents False: a step's residents are left out (``((), ())``: none read them)
        self._unread = None if residents else ((), ())

    def _start(self) -> bool:
        """Begin a batch of the running requests, if they qualify (else False, changing nothing)."""
        s = self.scheduler
        running, bm = s.running, s.block_manager
        if not running or s.prefill_first or s.admission is not None or bm.offload is not None or s.eos_token_ids:
            return False
        self.t = 0  # the next step's index in the batch
        self.ends: list[float] = []  # each batch step's end time
        self.base: dict[str, int] = {}  # a decode's tokens computed at batch step j: base + j
        self.entry: dict[str, int] = {}  # the batch step up to which a decode is brought forward
        self.order: dict[str, int] = {}  # a decode's position in admission order
        self.growth: list[dict[str, Request]] = [{} for _ in range(bm.block_size)]
        self.finishing: dict[int, list[Request]] = {}  # batch step -> the decodes finishing in it
        self.finish_steps: list[int] = []  # finishing's steps, a heap
        self.tail: Request | None = None  # the last running request, in its prefill
        self._seq = 0
        last = running[-1]
        if not _decoding(last):
            self.tail = last
        for request in running if self.tail is None else running[:-1]:
            if not (_decoding(request) and self._join(request, 0)):
                self.base.clear()  # nothing else was changed
                return False
        self.active = True
        return True

    def _join(self, request: Request, step: int) -> bool:
        """Add a decoding ``request`` as of batch step ``step``; False where its block table is
        longer than its tokens need (no step it takes a block in follows from its count)."""
        block_size = len(self.growth)
        computed, rid = request.num_computed_tokens, request.request_id
        first = len(self.scheduler.block_manager.block_tables[rid]) * block_size - computed
        if not 0 <= first < block_size:
            return False
        self.base[rid] = computed - step
        self.entry[rid] = step
        self.order[rid] = self._seq
        self._seq += 1
        self.growth[(step + first) % block_size][rid] = request
        finish = step + request.sampling_params.max_tokens - len(request.output_token_ids) - 1
        if finish not in self.finishing:
            self.finishing[finish] = []
            heappush(self.finish_steps, finish)
        self.finishing[finish].append(request)
        return True

    def sync(self, request: Request, step: int) -> None:
        """Bring ``request`` (a decode of the batch) forward to batch step ``step``: its counters,
        output ids and token times as the steps before it left them."""
        rid = request.request_id
        entry = self.entry[rid]
        if step > entry:
            _bring_forward(request, self.base[rid] + step)
            request.token_times.extend(self.ends[entry:step])
            self.entry[rid] = step

    def settle(self) -> None:
        """Bring every decode forward to now and end the batch."""
        if not self.active:
            return
        self.active = False
        requests = self.scheduler._requests
        for rid in self.base:
            self.sync(requests[rid], self.t)

    def runs_ruled_out(self) -> bool:
        """Whether the batch goes on rather than settle for a decode run (engine.decode_run): none
        can start (a request in prefill, or one waiting that could be admitted) or it would be
        short (a decode finishes within ``RUN_AHEAD`` steps; a run needs none within two)."""
        if not self.active:
            return False
        s, n = self.scheduler, len(self.base)
        return (
            self.tail is not None
            or bool(self.finish_steps and self.finish_steps[0] < self.t + RUN_AHEAD)
            or bool(s.waiting and n < s.max_num_seqs and n < s.max_num_batched_tokens)
        )

    def schedule(self, now: float) -> DecodeStep | None:
        """``scheduler.schedule(now)`` as a ``DecodeStep``, the batch begun if need be; None,
        changing nothing, where the step is not one of the batch's (the caller then settles and
        asks the scheduler)."""
        if not self.active and not self._start():
            return None
        s = self.scheduler
        bm, t, tail = s.block_manager, self.t, self.tail
        n, budget = len(self.base), s.max_num_batched_tokens
        if (n >= budget if tail is not None else n > budget) or not (n or tail):
            return None  # the decodes alone fill the budget, or nothing runs: the scheduler's step
        growing = self.growth[t % len(self.growth)]
        need = len(growing)
        if tail is not None:
            start = tail.num_computed_tokens
            end = min(tail.num_tokens, start + budget - n)
            need += max(bm.num_blocks_for(end) - len(bm.block_tables[tail.request_id]), 0)
        if need > bm.num_free_blocks:
            return None  # some request could preempt
        if growing:
            bm.append_blocks(list(growing))  # in admission order, as _schedule_running's _make_room
        queried0, hit0 = s.num_prefix_queried_tokens, s.num_prefix_hit_tokens
        scheduled: list[ScheduledRequest] = []
        context = sum(self.base.values()) + n * (t + 1)  # each decode attends its context: c + 1
        left, num_decode, decode_context = budget - n, n, context
        if tail is not None:
            left, tail_decodes, tail_context = s._schedule_running(left, scheduled, [], [tail])
            num_decode, decode_context = num_decode + tail_decodes, decode_context + tail_context
        left, num_decode, decode_context = s._admit_waiting(now, left, num_decode, decode_context, scheduled)
        s._blocks_held = bm.num_used_blocks
        admitted = SchedulerOutput(
            scheduled=tuple(scheduled),
            num_prefill_tokens=budget - left - num_decode,
            num_decode_tokens=num_decode - n,
            num_decode_context_tokens=decode_context - context,
        )
        return DecodeStep(
            admitted,
            admitted.num_prefill_tokens,
            num_decode,
            decode_context,
            context + admitted.num_context_tokens,
            context + admitted.num_attended_tokens,  # a decode attends its whole context: c + 1 pairs
            s.num_prefix_queried_tokens - queried0,
            s.num_prefix_hit_tokens - hit0,
            residents=self._unread,
        )

    def update(self, step: DecodeStep, token_id: int, now: float) -> DecodeStep:
        """``scheduler.update_from_output`` for ``step`` ended at ``now`` (every request samples
        ``token_id``, or its replayed reply's next token); returns ``step`` with its ``residents``,
        the requests holding blocks after it and their computed tokens (``Scheduler.kv_residents``);
        ``step`` as it was in a batch that leaves them out (``residents`` False: ``((), ())``)."""
        s = self.scheduler
        bm, t = s.block_manager, self.t
        self.ends.append(now)
        finishing = self.finishing.pop(t, ())
        if finishing:
            heappop(self.finish_steps)  # t: no step before it is left
        growth = self.growth
        fills = growth[(t + 1) % len(growth)] if bm.enable_prefix_caching else {}
        events: list[Request] = [*finishing]
        if fills:  # a block filled: offered to the prefix cache, in admission order with the finishes
            events = sorted({*finishing, *fills.values()}, key=lambda r: self.order[r.request_id])
        done = set(map(id, finishing))
        for request in events:
            self.sync(request, t + 1)
            rid = request.request_id
            if rid in fills:
                bm.cache_computed_blocks(request)
            if id(request) in done:
                # its growth slot, from _join: (step + first) % block_size == -base % block_size
                del growth[-self.base[rid] % len(growth)][rid]
                del self.base[rid], self.entry[rid], self.order[rid]
                s._finish(request, FinishReason.LENGTH, now)
        tail, self.tail = self.tail, None
        scheduled = step.admitted.scheduled
        if scheduled:
            s.update_from_output(step.admitted, dict.fromkeys(map(_REQUEST_ID, scheduled), token_id), now)
            tail = None
        self.t = t + 1
        requests = s._requests
        # the prefill and the admitted requests: decoding now (they join), finished, or in prefill
        for after in [tail] if tail is not None else [requests.get(r.request_id) for r in scheduled]:
            if after is None or after.status is not RequestStatus.RUNNING:
                continue
            if _decoding(after):
                if not self._join(after, t + 1):
                    self.settle()
            else:
                self.tail = after
        if self.tail is not None and (not s.running or s.running[-1] is not self.tail):
            self.settle()  # not a state the batch describes (the scheduler's steps will take it)
        if self._unread is not None:
            return step
        ids = tuple(map(_REQUEST_ID, s.running))
        if not self.active:
            return step._replace(residents=(ids, tuple(r.num_computed_tokens for r in s.running)))
        decodes = ids[:-1] if self.tail is not None else ids
        tokens = tuple(map(add, map(self.base.__getitem__, decodes), repeat(t + 1)))
        if self.tail is not None:
            tokens = (*tokens, self.tail.num_computed_tokens)
        return step._replace(residents=(ids, tokens))


def _decoding(request: Request) -> bool:
    """Whether ``request`` has exactly its last sampled token left to compute."""
    computed, num_prompt = request.num_computed_tokens, len(request.prompt_token_ids)
    return computed >= num_prompt and num_prompt + len(request.output_token_ids) - computed == 1
