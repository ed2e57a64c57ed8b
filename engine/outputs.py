"""The values that cross the engine's internal and public boundaries.

scheduler --SchedulerOutput--> model runner --sampled ids--> scheduler
engine.step() --> (list[RequestOutput], StepStats) --> the load driver

All frozen: a receiver can keep them without copying.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from engine.frozen import fast_init
from engine.request import Request

if TYPE_CHECKING:
    import torch


class ScheduledRequest(NamedTuple):
    """One request's share of a step (a NamedTuple: built once per request per step, it must be
    cheap; frozen all the same).

    ``token_ids`` are ``all_token_ids[num_computed_tokens : num_computed_tokens + len(token_ids)]``;
    their positions start at ``num_computed_tokens``. ``block_ids`` is the request's block table
    after this step's allocation, long enough for ``num_computed_tokens + len(token_ids)`` tokens.
    ``sample`` is True when the chunk reaches the last known token, so its logits give the next
    token (False for a prefill chunk that stops short of the prompt's end).
    ``prompt_logits_positions``: prompt positions whose logits the request asked for
    (``SamplingParams.num_prompt_logits``); the runner returns those that fall in this chunk.
    """

    request_id: str
    token_ids: tuple[int, ...]
    num_computed_tokens: int
    block_ids: tuple[int, ...]
    sample: bool
    prompt_logits_positions: range = range(0)

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """Context length after this step: cached + new tokens."""
        return self.num_computed_tokens + len(self.token_ids)


@fast_init  # built once a step or request (engine.frozen)
@dataclass(frozen=True)
class SchedulerOutput:
    """What to run this step, in batch order, and what the scheduler did to make room.

    Decode tokens are single tokens that extend a request's generated output; every other
    scheduled token (prompt, chunked prefill, recompute after preemption) counts as prefill.
    """

    scheduled: tuple[ScheduledRequest, ...]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_decode_context_tokens: int = 0  # the decodes' cached + new tokens (a step-time model's feature)
    preempted_request_ids: tuple[str, ...] = ()
    num_prefix_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache this step
    num_prefix_hit_tokens: int = 0  # of those, found cached
    # what the step computes (a step-time model's features), counted once at construction
    num_context_tokens: int = field(init=False)
    num_attended_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        """``num_context_tokens``: sum over scheduled requests of ``seq_len`` (cached + new tokens),
        the K/V the step's attention reads, in tokens per layer. ``num_attended_tokens``: query-key
        pairs of the step's causal attention, per head: a request with ``c`` cached and ``n`` new
        tokens attends ``n x c + n x (n + 1) / 2`` (new token i sees c + i + 1 keys)."""
        context = attended = 0
        for s in self.scheduled:
            n, c = len(s.token_ids), s.num_computed_tokens
            context += c + n
            attended += n * c + n * (n + 1) // 2
        object.__setattr__(self, "num_context_tokens", context)  # frozen: set once, here
        object.__setattr__(self, "num_attended_tokens", attended)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_prefill_seqs(self) -> int:
        """Requests computing more than a decode token this step (prompt chunks, recomputes)."""
        return len(self.scheduled) - self.num_decode_tokens


@fast_init  # built once a step or request (engine.frozen)
@dataclass(frozen=True)
class StepStats:
    """One engine step, as the load driver records it.

    Times are ``time.perf_counter()`` seconds. Block counts are read after the step finished
    (finished requests' blocks already freed), except ``num_peak_used_blocks``: the blocks held
    while the step ran (after scheduling allocated, before finished requests freed theirs), so a
    request that finishes in the step that admits it still shows its blocks; None from a
    producer that does not track it (read it as ``num_used_blocks``). ``kv_resident_tokens`` holds, for every request
    holding blocks at that moment, its tokens with K/V in the cache (``num_computed_tokens``),
    and ``kv_resident_request_ids`` names those requests in the same order: an estimator turns
    these into bytes and compares with ``num_used_blocks``.

    The last four describe the work the step ran (``SchedulerOutput``'s fields of the same
    names), for fitting a step-time model; 0 in stats written before they existed.
    """

    step_index: int
    start_time: float
    end_time: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_used_blocks: int
    num_free_blocks: int
    num_total_blocks: int
    num_preemptions: int
    num_finished: int = 0
    num_oom: int = 0
    kv_resident_tokens: tuple[int, ...] = ()
    kv_resident_request_ids: tuple[str, ...] = ()
    num_prefix_queried_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    num_peak_used_blocks: int | None = None
    num_prefill_seqs: int = 0
    num_context_tokens: int = 0
    num_attended_tokens: int = 0
    num_decode_context_tokens: int = 0
    # admission on (engine.admission): each tenant with requests queued or running, by name, and
    # its running and waiting requests after the step; () when admission is off
    tenant_ids: tuple[str, ...] = ()
    tenant_num_running: tuple[int, ...] = ()
    tenant_num_waiting: tuple[int, ...] = ()
    # offload tiers on (engine.offload): blocks stored into / loaded from each lower tier during
    # the step, the prefix-hit tokens each served (the device's = num_prefix_hit_tokens less
    # both), bytes moved each way, and the entries each tier holds after the step; 0 when off
    num_host_stores: int = 0
    num_disk_stores: int = 0
    num_host_loads: int = 0
    num_disk_loads: int = 0
    num_host_hit_tokens: int = 0
    num_disk_hit_tokens: int = 0
    offload_bytes_stored: int = 0
    offload_bytes_loaded: int = 0
    num_host_blocks: int = 0
    num_disk_blocks: int = 0


class DecodeRunSteps(Sequence[StepStats]):
    """The steps of a decode run (engine.decode_run), described by its first step and the growth
    per step; each step's exact ``StepStats`` is built only where it is read (``run[j]``, iterating):
    a capacity probe that only summarises the run reads the columns instead (``ends``, ``starts``,
    ``used_blocks``), with no object per step. Step ``j`` of ``len(run)`` (0-based)::

        step_index first_index + j; start_time starts[j]; end_time ends[j]
        num_decode_tokens = num_running = n = len(computed); no prefill, preemption or finish
        num_used_blocks = num_peak_used_blocks = used + the blocks taken in steps 0..j
        num_free_blocks = free - the same      (taken_steps: the step of each block taken, in order)
        kv_resident_tokens (c_i + j + 1 for each request's c_i in ``computed``), kv_resident_request_ids ``ids``
        num_context_tokens = num_attended_tokens = num_decode_context_tokens = sum(c_i) + n x (j + 1)
        num_waiting, num_total_blocks and ``columns`` (admission's tenant columns, offload's tier
        sizes) as at the run's start; every other field 0
    """

    __slots__ = (
        *("first_index", "starts", "ends", "computed", "ids", "num_waiting", "used", "free"),
        *("num_total_blocks", "taken_steps", "columns", "context0"),
    )

    def __init__(
        self,
        first_index: int,
        starts: list[float],
        ends: list[float],
        computed: Sequence[int],
        ids: tuple[str, ...],
        counts: tuple[int, int, int, int],
        taken_steps: list[int],
        columns: dict[str, Any],
    ):
        """``counts``: (waiting requests, used blocks, free blocks, all blocks) at the run's start."""
        self.first_index, self.starts, self.ends, self.computed, self.ids = first_index, starts, ends, computed, ids
        self.num_waiting, self.used, self.free, self.num_total_blocks = counts
        self.taken_steps, self.columns = taken_steps, columns
        self.context0 = sum(computed) + len(computed)

    def __len__(self) -> int:
        return len(self.ends)

    def used_blocks(self, j: int) -> int:
        """Blocks in use after step ``j`` (0-based)."""
        return self.used + bisect_right(self.taken_steps, j)

    def _step(self, j: int) -> StepStats:
        n, grown = len(self.computed), bisect_right(self.taken_steps, j)
        context = self.context0 + n * j
        return StepStats(
            step_index=self.first_index + j,
            start_time=self.starts[j],
            end_time=self.ends[j],
            num_prefill_tokens=0,
            num_decode_tokens=n,
            num_running=n,
            num_waiting=self.num_waiting,
            num_used_blocks=self.used + grown,
            num_free_blocks=self.free - grown,
            num_total_blocks=self.num_total_blocks,
            num_preemptions=0,
            num_finished=0,
            num_oom=0,
            kv_resident_tokens=tuple(map((j + 1).__add__, self.computed)),
            kv_resident_request_ids=self.ids,
            num_prefix_queried_tokens=0,
            num_prefix_hit_tokens=0,
            num_peak_used_blocks=self.used + grown,
            num_prefill_seqs=0,
            num_context_tokens=context,
            num_attended_tokens=context,
            num_decode_context_tokens=context,
            **self.columns,
        )

    @overload
    def __getitem__(self, index: int) -> StepStats: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepStats]: ...

    def __getitem__(self, index: int | slice) -> StepStats | list[StepStats]:
        if isinstance(index, slice):
            return [self._step(j) for j in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"step {index} of a run of {len(self)}")
        return self._step(index)

    def __iter__(self) -> Iterator[StepStats]:
        return map(self._step, range(len(self)))

    def part(self, begin: int, end: int, num_waiting: int) -> DecodeRunSteps:
        """Steps ``begin``..``end - 1`` as a run of their own, with ``num_waiting`` requests waiting
        (a run taken past arrivals that join the queue: kvplan.run.sim.backend)."""
        grown = bisect_left(self.taken_steps, begin)
        counts = (num_waiting, self.used + grown, self.free - grown, self.num_total_blocks)
        taken = [j - begin for j in self.taken_steps[grown : bisect_left(self.taken_steps, end)]]
        computed = [c + begin for c in self.computed]
        starts, ends = self.starts[begin:end], self.ends[begin:end]
        return DecodeRunSteps(self.first_index + begin, starts, ends, computed, self.ids, counts, taken, self.columns)


@dataclass(frozen=True)
class RequestOutput:
    """A finished request: its tokens, its timeline, and why it stopped.

    ``token_times[i]`` is when output token i was produced. ``text`` is the decoded output
    (None when the model has no tokenizer). ``finish_detail`` carries the numbers behind
    ``cannot_fit`` and ``oom`` (e.g. "needs 70 blocks, cache has 64"). ``prompt_logits``:
    [num_prompt_logits, vocab_size] fp32 when the request asked for them and finished by
    ``stop`` or ``length`` (see ``SamplingParams.num_prompt_logits``), else None.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    text: str | None
    finish_reason: str
    finish_detail: str
    arrival_time: float
    first_scheduled_time: float | None
    token_times: tuple[float, ...]
    finish_time: float
    num_preemptions: int
    num_cached_tokens: int
    prompt_logits: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_request(
        cls, request: Request, text: str | None, prompt_logits: torch.Tensor | None = None
    ) -> RequestOutput:
        assert request.finish_reason is not None and request.finish_time is not None
        return cls(
            request_id=request.request_id,
            prompt_token_ids=tuple(request.prompt_token_ids),
            output_token_ids=tuple(request.output_token_ids),
            text=text,
            finish_reason=request.finish_reason,
            finish_detail=request.finish_detail,
            arrival_time=request.arrival_time,
            first_scheduled_time=request.first_scheduled_time,
            token_times=tuple(request.token_times),
            finish_time=request.finish_time,
            num_preemptions=request.num_preemptions,
            num_cached_tokens=request.num_cached_tokens,
            prompt_logits=prompt_logits,
        )
