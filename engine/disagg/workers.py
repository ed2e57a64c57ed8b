"""PrefillWorker and DecodeWorker: an ``LLMEngine`` in one role of a disaggregated deployment.

PrefillWorker runs each request with max_tokens = 1 (EOS ignored at token 1 when the client's
min_tokens > 1, as the aggregated engine would not stop there) and turns each one that ends by
length into a ``Handoff`` whose blocks it holds (``export`` reads them, ``release`` frees them).
A request the client asked one token of, or that stopped at EOS, simply finishes.

DecodeWorker keeps a FIFO of offered handoffs. ``begin_step`` (call at the start of each of its
steps, before ``engine.step()``) first joins every handoff whose transfer completed into the
running set, then admits handoffs FIFO while running + in transfer < max_num_seqs and the pool
can allocate prompt_len + 1 tokens of blocks (a handoff that does not fit blocks those behind
it); the caller moves each admitted handoff's K/V (``complete``). Counters: blocks, bytes and
seconds moved, per worker.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

from engine.config import EngineConfig, SettingError
from engine.disagg.kv_blocks import export_blocks, import_blocks
from engine.disagg.scheduler import DisaggScheduler
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput, StepStats
from engine.request import Request, SamplingParams

ADMISSION_FIELDS = ("max_num_waiting", "kv_admission_reserve", "tenant_max_concurrency", "tenant_max_waiting")


def worker_engine(config: EngineConfig, role: str) -> LLMEngine:
    """An LLMEngine whose scheduler is a ``DisaggScheduler`` for ``role`` (prefill | decode).

    Raises:
        SettingError: a role other than prefill or decode, or an admission setting (the entry's
            admission belongs to the router, not to a worker).
    """
    if role not in ("prefill", "decode"):
        raise SettingError("role", f"must be prefill or decode (got {role!r})")
    for name in ADMISSION_FIELDS:
        if getattr(config, name) is not None:
            raise SettingError(name, f"admission settings are not supported on a {role} worker; leave it unset")
    engine = LLMEngine(config)
    engine.scheduler = DisaggScheduler(
        config, engine.num_blocks, engine.max_model_len, engine.eos_token_ids, hold=role == "prefill"
    )
    return engine


@dataclass
class Handoff:
    """A request between its prefill and its decode. ``params``: the client's; ``first_token``:
    output token 1, sampled at ``first_token_time`` (perf_counter s) by the prefill worker."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    first_token: int
    params: SamplingParams
    arrival_time: float
    first_token_time: float
    block_size: int
    cache_salt: str | None = None
    first_scheduled_time: float | None = None
    num_cached_tokens: int = 0

    @property
    def num_blocks(self) -> int:
        """Blocks that move: ceil(prompt_len / block_size)."""
        return -(-len(self.prompt_token_ids) // self.block_size)


def prefill_params(params: SamplingParams) -> SamplingParams:
    """The client's params as the prefill worker runs them: one token, EOS not ending it where
    the client's min_tokens > 1."""
    return replace(
        params,
        max_tokens=1,
        min_tokens=min(params.min_tokens, 1),
        ignore_eos=params.ignore_eos or params.min_tokens > 1,
    )


class PrefillWorker:
    """An LLMEngine made by ``worker_engine(config, "prefill")``; see the module docstring."""

    def __init__(self, engine: LLMEngine):
        if not isinstance(engine.scheduler, DisaggScheduler) or not engine.scheduler.hold:
            raise ValueError("engine: make it with worker_engine(config, 'prefill')")
        self.engine, self.scheduler = engine, engine.scheduler
        self._params: dict[str, tuple[SamplingParams, str | None]] = {}  # the client's params, cache salt
        self.num_exported_blocks = self.num_exported_bytes = 0

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Queue a request (the client's params); raises as ``LLMEngine.add_request``."""
        self.engine.add_request(prompt_token_ids, prefill_params(params), request_id, arrival_time, cache_salt)
        self._params[request_id] = (params, cache_salt)
        return request_id

    def step(self) -> tuple[list[RequestOutput], list[Handoff], StepStats]:
        """One engine step: (requests that finished here, new handoffs, the step's stats)."""
        outputs, stats = self.engine.step()
        done, handoffs = [], []
        for out in outputs:
            params, salt = self._params.pop(out.request_id, (None, None))
            if out.request_id not in self.scheduler.held:
                done.append(out)
            elif params is None or params.max_tokens == 1:
                self.scheduler.release(out.request_id)
                done.append(out)
            else:
                handoffs.append(
                    Handoff(
                        out.request_id,
                        out.prompt_token_ids,
                        out.output_token_ids[0],
                        params,
                        out.arrival_time,
                        out.token_times[0],
                        self.engine.block_size,
                        salt,
                        out.first_scheduled_time,
                        out.num_cached_tokens,
                    )
                )
        return done, handoffs, stats

    def export(self, request_id: str) -> bytes:
        """The held request's K/V, all its blocks (``kv_blocks`` layout). Raises KeyError: not held."""
        block_ids = self.scheduler.held[request_id]
        payload = export_blocks(self.engine.kv_cache, block_ids)
        self.num_exported_blocks += len(block_ids)
        self.num_exported_bytes += len(payload)
        return payload

    def release(self, request_id: str) -> None:
        """Free a held request's blocks (the transfer ended, or it was cancelled)."""
        self.scheduler.release(request_id)

    def abort(self, request_id: str) -> None:
        """Cancel in prefill (frees its blocks at the next step) or while held (frees them now)."""
        self._params.pop(request_id, None)
        self.engine.abort(request_id)
        self.scheduler.release(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()


class DecodeWorker:
    """An LLMEngine made by ``worker_engine(config, "decode")``; see the module docstring."""

    def __init__(self, engine: LLMEngine):
        if not isinstance(engine.scheduler, DisaggScheduler) or engine.scheduler.hold:
            raise ValueError("engine: make it with worker_engine(config, 'decode')")
        self.engine, self.scheduler = engine, engine.scheduler
        self.queue: deque[Handoff] = deque()
        self.in_transfer: dict[str, Handoff] = {}
        self._ready: list[Handoff] = []
        self.num_imported_blocks = self.num_imported_bytes = self.num_transfers = 0
        self.transfer_seconds = 0.0

    def offer(self, handoff: Handoff) -> None:
        self.queue.append(handoff)

    def never_fits(self, handoff: Handoff) -> str:
        """Why ``handoff`` can never run on this worker ("" when it can), by the aggregated engine's
        cannot_fit rule (Scheduler.add_request): prompt + max_tokens tokens over max_model_len, or
        blocks for prompt + max_tokens - 1 tokens (the last token needs no slot) more than the
        whole pool. Such a handoff would wait at the head of the FIFO forever."""
        length = len(handoff.prompt_token_ids) + handoff.params.max_tokens
        if length > self.scheduler.max_model_len:
            prompt, wanted = len(handoff.prompt_token_ids), handoff.params.max_tokens
            return f"prompt {prompt} + max_tokens {wanted} = {length} tokens > max_model_len"
        bm = self.scheduler.block_manager
        needed = bm.num_blocks_for(length - 1)
        return f"needs {needed} blocks, the decode worker's cache has {bm.num_blocks}" if needed > bm.num_blocks else ""

    def begin_step(self, now: float | None = None) -> list[Handoff]:
        """Join the completed transfers, then admit handoffs FIFO; returns the admitted ones (their
        blocks allocated here, under the request id), whose K/V the caller moves."""
        now = time.perf_counter() if now is None else now
        for handoff in self._ready:
            self._join(handoff, now)
        self._ready = []
        bm, admitted = self.scheduler.block_manager, []
        while self.queue and self.scheduler.num_running + len(self.in_transfer) < self.scheduler.max_num_seqs:
            handoff = self.queue[0]
            if not bm.allocate(handoff.request_id, len(handoff.prompt_token_ids) + 1):
                break  # FIFO: the ones behind it wait too
            self.queue.popleft()
            self.in_transfer[handoff.request_id] = handoff
            admitted.append(handoff)
        return admitted

    def complete(self, request_id: str, payload: bytes, seconds: float) -> None:
        """The transfer of an admitted handoff ended: write its K/V into its first blocks; it joins
        at the next ``begin_step``. ``seconds``: how long the move took up to here (measured by the
        caller); the import's own time is added. An id no longer in transfer (cancelled meanwhile) is ignored.

        Raises:
            ValueError: a payload that is not the handoff's blocks (kv_blocks.import_blocks).
        """
        handoff = self.in_transfer.pop(request_id, None)
        if handoff is None:
            return
        start = time.perf_counter()
        block_ids = self.scheduler.block_manager.block_table(request_id)[: handoff.num_blocks]
        import_blocks(self.engine.kv_cache, block_ids, payload)
        seconds += time.perf_counter() - start
        self.num_imported_blocks += len(block_ids)
        self.num_imported_bytes += len(payload)
        self.num_transfers += 1
        self.transfer_seconds += seconds
        self._ready.append(handoff)

    def _join(self, h: Handoff, now: float) -> None:
        request = Request(h.request_id, h.prompt_token_ids, h.params, h.arrival_time, h.cache_salt)
        request.output_token_ids.append(h.first_token)
        request.token_times.append(h.first_token_time)
        request.num_computed_tokens = len(h.prompt_token_ids)
        request.first_scheduled_time = h.first_scheduled_time
        request.num_cached_tokens = h.num_cached_tokens
        self.scheduler.join(request, now)
        self.engine.sampler.add(h.request_id, h.params)

    def abort(self, request_id: str) -> str | None:
        """Cancel wherever the request is here; returns the phase it was in (``waiting``,
        ``transfer``, ``decode``) or None for an id unknown here."""
        for handoff in self.queue:
            if handoff.request_id == request_id:
                self.queue.remove(handoff)
                return "waiting"
        ready = [h for h in self._ready if h.request_id == request_id]
        if request_id in self.in_transfer or ready:
            self.in_transfer.pop(request_id, None)
            self._ready = [h for h in self._ready if h.request_id != request_id]
            self.scheduler.block_manager.free(request_id)
            return "transfer"
        if self.scheduler.knows(request_id):
            self.engine.abort(request_id)
            return "decode"
        return None

    @property
    def num_waiting_handoffs(self) -> int:
        return len(self.queue)

    def has_unfinished(self) -> bool:
        return bool(self.queue or self.in_transfer or self._ready) or self.engine.has_unfinished()
