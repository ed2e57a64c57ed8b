"""Scheduler: who runs this step, and how many tokens each, under the token budget.

Iteration-level continuous batching counted in tokens (vLLM v1's scheduler design, docs.vllm.ai
"vLLM V1" and Yu et al., "Orca", OSDI 2022): each step every running request asks for
``num_tokens - num_computed_tokens`` more tokens (1 for a decode, a chunk for a prefill), taken
in order until ``max_num_batched_tokens`` is spent; then waiting requests are admitted first come,
first served while blocks, budget and ``max_num_seqs`` allow. A prompt longer than the remaining
budget is prefilled in chunks over several steps (chunked prefill). With ``prefill_first`` (SGLang's;
engine.config) a step with prefill to do computes prefills only; decodes wait for one without; a step
that can schedule no prefill (no blocks for the next admission) decodes only and admits nothing.

When a running request needs a block and none is free, the most recently admitted running request
is preempted by recompute (Kwon et al., "PagedAttention", SOSP 2023, section 4.5): its blocks are
freed, its computed tokens forgotten, and it goes back to the front of the waiting queue; no new
request is admitted in a step that preempted. The scheduler owns the queues; the BlockManager
owns blocks and block tables. Admission at the entry (queue bound, KV budget, output cap,
per-tenant limits) is engine.admission's, called at every change of a request's state; None when
the config sets none of it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from operator import attrgetter

from engine.admission import Admission
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.outputs import ScheduledRequest, SchedulerOutput, StepStats
from engine.request import FinishReason, Request, RequestStatus

_NO_POSITIONS = range(0)
# ScheduledRequest(*fields) without NamedTuple's Python-level __new__: one is built per running
# request per step
_new_scheduled = partial(tuple.__new__, ScheduledRequest)
_REQUEST_ID, _NUM_COMPUTED = attrgetter("request_id"), attrgetter("num_computed_tokens")


class Scheduler:
    """Queues, token budget, preemption.

    Args:
        config: max_num_seqs, max_num_batched_tokens, block_size, enable_prefix_caching. num_blocks: pool's blocks.
        max_model_len: longest prompt + max_tokens a request may ask for (tokens).
        eos_token_ids: ids that end a request (unless its ignore_eos is set).
    """

    def __init__(
        self,
        config: EngineConfig,
        num_blocks: int,
        max_model_len: int,
        eos_token_ids: frozenset[int] = frozenset(),
    ):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last one is preempted first
        self._requests: dict[str, Request] = {}
        self._finished: list[Request] = []
        # Prefix-cache lookups of admitted requests (cumulative): tokens looked up, tokens found.
        self.num_prefix_queried_tokens = self.num_prefix_hit_tokens = 0
        self._blocks_held = 0  # used blocks once the last schedule() allocated: the step's peak
        self.admission = Admission.of(config, num_blocks)
        self.prefill_first = config.prefill_first

    # ---- views -------------------------------------------------------------------------
    num_waiting = property(lambda self: len(self.waiting))
    num_running = property(lambda self: len(self.running))
    num_used_blocks = property(lambda self: self.block_manager.num_used_blocks)
    num_free_blocks = property(lambda self: self.block_manager.num_free_blocks)
    num_total_blocks = property(lambda self: self.block_manager.num_blocks)

    def get_request(self, request_id: str) -> Request:
        return self._requests[request_id]

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def has_untaken_finished(self) -> bool:
        """Requests finished (aborted, rejected) whose outputs ``take_finished`` has not yet returned."""
        return bool(self._finished)

    def knows(self, request_id: str) -> bool:
        """Whether ``request_id`` is in use: waiting, running, or finished and not yet taken."""
        return request_id in self._requests

    def kv_residents(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The requests holding blocks (running ones), in admission order, and the tokens each
        has with K/V in the cache: (request ids, num_computed_tokens)."""
        return tuple(map(_REQUEST_ID, self.running)), tuple(map(_NUM_COMPUTED, self.running))

    def step_stats(
        self, step_index: int, start: float, end: float, output: SchedulerOutput, num_finished: int, num_oom: int = 0
    ) -> StepStats:
        """The stats of a step that ran ``output`` from ``start`` to ``end``, read now (after its update): the
        engine's and a simulation's steps are described by this one function. The peak used blocks are those held
        right after ``schedule()`` allocated (or now, if more); ``output.residents``, where set, the KV residents."""
        resident_ids, resident_tokens = getattr(output, "residents", None) or self.kv_residents()
        return StepStats(
            step_index=step_index,
            start_time=start,
            end_time=end,
            num_prefill_tokens=output.num_prefill_tokens,
            num_decode_tokens=output.num_decode_tokens,
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_used_blocks=self.num_used_blocks,
            num_free_blocks=self.num_free_blocks,
            num_total_blocks=self.num_total_blocks,
            num_preemptions=len(output.preempted_request_ids),
            num_finished=num_finished,
            num_oom=num_oom,
            kv_resident_tokens=resident_tokens,
            kv_resident_request_ids=resident_ids,
            num_prefix_queried_tokens=output.num_prefix_queried_tokens,
            num_prefix_hit_tokens=output.num_prefix_hit_tokens,
            num_peak_used_blocks=max(self._blocks_held, self.num_used_blocks),
            num_prefill_seqs=output.num_prefill_seqs,
            num_context_tokens=output.num_context_tokens,
            num_attended_tokens=output.num_attended_tokens,
            num_decode_context_tokens=output.num_decode_context_tokens,
            **(self.admission.tenant_columns() if self.admission is not None else {}),
            **self.block_manager.offload_columns(),
        )

    # ---- requests in and out -----------------------------------------------------------
    def add_request(self, request: Request, now: float) -> None:
        """Queue ``request``, or finish it at once with CANNOT_FIT if it could never run, or with
        REJECTED if admission refuses it now (engine.admission; its max_tokens clamped first).

        Raises:
            ValueError: a request id already in use, an empty prompt, or num_prompt_logits above
                the prompt's length.
        """
        if request.request_id in self._requests:
            raise ValueError(f"request_id: {request.request_id!r} is already in use")
        if not request.prompt_token_ids:
            raise ValueError("prompt_token_ids: must hold at least one token")
        if request.sampling_params.num_prompt_logits > request.num_prompt_tokens:
            raise ValueError(
                f"num_prompt_logits: must be <= the prompt's {request.num_prompt_tokens} tokens "
                f"(got {request.sampling_params.num_prompt_logits})"
            )
        self._requests[request.request_id] = request
        admission = self.admission
        if admission is not None:
            request.sampling_params = admission.clamp(request.sampling_params)
        max_len = request.num_prompt_tokens + request.sampling_params.max_tokens
        # The last output token is never fed back, so its K/V needs no slot.
        num_blocks_needed = self.block_manager.num_blocks_for(max_len - 1)
        if max_len > self.max_model_len:
            detail = (
                f"prompt {request.num_prompt_tokens} + max_tokens {request.sampling_params.max_tokens}"
                f" = {max_len} tokens > max_model_len {self.max_model_len}"
            )
        elif num_blocks_needed > self.block_manager.num_blocks:
            detail = f"needs {num_blocks_needed} blocks, cache has {self.block_manager.num_blocks}"
        elif admission is not None and (never := admission.never_fits(num_blocks_needed)):
            detail = never
        elif admission is not None and (refusal := admission.refusal(request, num_blocks_needed, len(self.waiting))):
            self._finish(request, FinishReason.REJECTED, now, refusal)
            return
        else:
            if admission is not None:
                admission.queued(request, num_blocks_needed)
            self.waiting.append(request)
            return
        self._finish(request, FinishReason.CANNOT_FIT, now, detail)

    def finish_requests(self, request_ids: Iterable[str], reason: str, now: float, detail: str = "") -> None:
        """Finish requests from outside the normal flow (abort, oom); frees their blocks at once.
        Unknown or already finished ids are ignored."""
        for request_id in request_ids:
            request = self._requests.get(request_id)
            if request is None or request.is_finished:
                continue
            if request.status is RequestStatus.WAITING:
                self.waiting.remove(request)
            self._finish(request, reason, now, detail)

    def take_finished(self) -> list[Request]:
        """Requests finished since the last call, in finish order; they are forgotten after."""
        finished, self._finished = self._finished, []
        for request in finished:
            self._requests.pop(request.request_id, None)
        return finished

    def _finish(self, request: Request, reason: str, now: float, detail: str = "") -> None:
        if self.admission is not None:
            self.admission.finished(request)
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        self.block_manager.free(request.request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason, request.finish_detail, request.finish_time = reason, detail, now
        self._finished.append(request)

    # ---- one step ----------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        """Pick this step's requests and token counts; allocate their blocks; preempt if needed."""
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        queried0, hit0 = self.num_prefix_queried_tokens, self.num_prefix_hit_tokens
        budget, num_decode, decode_context = self.max_num_batched_tokens, 0, 0
        # (running requests to schedule, None: all; whether to admit), until a pass schedules any
        passes: tuple[tuple[Sequence[Request] | None, bool], ...] = ((None, True),)
        if self.prefill_first and (self.waiting or self._last_in_prefill()):  # prefills only, else decodes only
            passes = ((self.running[-1:] if self._last_in_prefill() else (), True), (None, False))
        for requests, admit in passes:
            budget, num_decode, decode_context = self._schedule_running(budget, scheduled, preempted, requests)
            if admit and not preempted:  # no request is admitted in a step that preempted
                budget, num_decode, decode_context = self._admit_waiting(
                    now, budget, num_decode, decode_context, scheduled
                )
            if scheduled:
                break
        self._blocks_held = self.block_manager.num_used_blocks  # finishing requests only free blocks after this
        return SchedulerOutput(
            scheduled=tuple(scheduled),
            num_prefill_tokens=self.max_num_batched_tokens - budget - num_decode,
            num_decode_tokens=num_decode,
            num_decode_context_tokens=decode_context,
            preempted_request_ids=tuple(r.request_id for r in preempted),
            num_prefix_queried_tokens=self.num_prefix_queried_tokens - queried0,
            num_prefix_hit_tokens=self.num_prefix_hit_tokens - hit0,
        )

    def _schedule_running(
        self,
        budget: int,
        scheduled: list[ScheduledRequest],
        preempted: list[Request],
        requests: Sequence[Request] | None = None,
    ) -> tuple[int, int, int]:
        """Give running requests, in admission order, their remaining tokens (a decode's one, a
        prefill's chunk) within ``budget``; appends to ``scheduled`` and ``preempted``. Returns
        (the budget left, the decodes among them, those decodes' context tokens); ``requests``: only
        these (a prefill_first step's: the one in prefill). It runs for every running request every
        step, so its common case (a decode whose last block has room) reads each field once."""
        bm = self.block_manager
        tables, block_size = bm.block_tables, bm.block_size
        num_decode = decode_context = 0
        # a preemption pops from the back of running: the loop then ends sooner
        for request in self.running if requests is None else requests:
            if not budget:
                break
            start = request.num_computed_tokens
            prompt, outputs = request.prompt_token_ids, request.output_token_ids
            num_prompt = len(prompt)
            num_tokens = num_prompt + len(outputs)
            end = num_tokens if num_tokens - start <= budget else start + budget
            table = tables[request.request_id]
            if end > len(table) * block_size:  # needs a block: most steps the last one has room
                if not self._make_room(request, end, preempted):
                    break
                table = tables[request.request_id]
            if end <= num_prompt:
                token_ids = prompt[start:end]
            elif end - start == 1:  # a decode: one token past the prompt, the last one sampled
                token_ids = (outputs[start - num_prompt],)
                num_decode += 1
                decode_context += end
            else:
                token_ids = request.token_ids_between(start, end)
            num_logits = request.sampling_params.num_prompt_logits
            scheduled.append(
                _new_scheduled(
                    (
                        request.request_id,
                        token_ids,
                        start,
                        table,
                        end == num_tokens,
                        range(num_prompt - num_logits, num_prompt) if num_logits else _NO_POSITIONS,
                    )
                )
            )
            budget -= end - start
        return budget, num_decode, decode_context

    def _last_in_prefill(self) -> bool:
        """Whether the last admitted running request has prompt (or recompute) tokens left. At most one
        is in prefill, the last admitted: a later one was admitted only with budget left over after
        it got all its remaining tokens (tests/engine/test_scheduler.py checks it)."""
        last = self.running[-1] if self.running else None
        return last is not None and (
            last.num_tokens - (done := last.num_computed_tokens) > 1 or done < last.num_prompt_tokens
        )

    def _make_room(self, request: Request, num_tokens: int, preempted: list[Request]) -> bool:
        """Grow ``request``'s blocks to ``num_tokens``, preempting running requests from the back
        (appended to ``preempted``) while none is free. False: ``request`` itself was preempted."""
        while not self.block_manager.allocate(request.request_id, num_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _admit_waiting(
        self, now: float, budget: int, num_decode: int, decode_context: int, scheduled: list[ScheduledRequest]
    ) -> tuple[int, int, int]:
        """Admit waiting requests first come, first served while blocks, ``budget`` and
        max_num_seqs allow, each from its longest cached prefix; appends to ``scheduled``.
        Returns (the budget left, ``num_decode`` plus the decodes admitted: a re-admitted request
        whose cached prefix leaves one token past its prompt, ``decode_context`` plus theirs).
        A request whose tenant is at its tenant_max_concurrency is passed over, keeping its place."""
        bm, admission = self.block_manager, self.admission
        held: list[Request] = []  # passed over (tenant at its cap), in queue order
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if admission is not None and not admission.may_run(request):
                held.append(self.waiting.popleft())
                continue
            # A request that wants prompt logits computes every prompt position itself.
            cached = [] if request.sampling_params.num_prompt_logits else bm.find_cached_prefix(request)
            num_cached = len(cached) * bm.block_size
            num_new = min(request.num_tokens - num_cached, budget)
            if not bm.allocate(request.request_id, num_cached + num_new, cached):
                break
            self.waiting.popleft()
            self.running.append(request)
            if admission is not None:
                admission.started(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_cached
            if bm.enable_prefix_caching and not request.sampling_params.num_prompt_logits:
                self.num_prefix_queried_tokens += request.num_tokens
                self.num_prefix_hit_tokens += num_cached
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
                request.num_cached_tokens = num_cached
            if num_new == 1 and num_cached >= request.num_prompt_tokens:
                num_decode += 1
                decode_context += num_cached + 1
            scheduled.append(self._scheduled(request, num_cached, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(held))
        return budget, num_decode, decode_context

    def _scheduled(self, request: Request, start: int, num_new: int) -> ScheduledRequest:
        """An admitted request's share of the step: ``num_new`` tokens from ``start`` (running
        requests get theirs in ``_schedule_running``'s loop, the same fields read inline)."""
        end = start + num_new
        num_prompt, num_logits = len(request.prompt_token_ids), request.sampling_params.num_prompt_logits
        return _new_scheduled(
            (
                request.request_id,
                request.token_ids_between(start, end),
                start,
                self.block_manager.block_tables[request.request_id],
                end == request.num_tokens,
                range(num_prompt - num_logits, num_prompt) if num_logits else _NO_POSITIONS,
            )
        )

    def _preempt(self, request: Request) -> None:
        if self.admission is not None:
            self.admission.preempted(request)
        self.block_manager.free(request.request_id, forget=False)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def update_from_output(self, output: SchedulerOutput, sampled_token_ids: Mapping[str, int], now: float) -> None:
        """Advance every scheduled request by its computed tokens; append sampled tokens; finish
        requests that hit EOS (unless ignore_eos, or before min_tokens) or max_tokens."""
        requests, bm, eos_token_ids = self._requests, self.block_manager, self.eos_token_ids
        block_size, running = bm.block_size, RequestStatus.RUNNING  # an enum member costs a lookup per read
        for s in output.scheduled:
            request_id = s.request_id
            request = requests.get(request_id)
            if request is None or request.status is not running:
                continue  # finished in between (abort, oom)
            before = request.num_computed_tokens
            request.num_computed_tokens = after = before + len(s.token_ids)
            if after // block_size != before // block_size:  # a block filled: offer it to the prefix cache
                bm.cache_computed_blocks(request)
            if not s.sample:
                continue
            token_id = sampled_token_ids[request_id]
            outputs = request.output_token_ids
            params = request.sampling_params
            forced = params.forced_token_ids
            if forced is not None and len(outputs) < len(forced):
                token_id = forced[len(outputs)]  # a replayed reply (SamplingParams.forced_token_ids)
            outputs.append(token_id)
            request.token_times.append(now)
            if token_id in eos_token_ids and not params.ignore_eos and len(outputs) >= params.min_tokens:
                self._finish(request, FinishReason.STOP, now)
            elif len(outputs) >= params.max_tokens:
                self._finish(request, FinishReason.LENGTH, now)
