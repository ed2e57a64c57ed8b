"""DisaggEngine: x prefill and y decode workers in one process, stepped by one loop.

The router's policy (docs/architecture.md#disagg): request i (in add order, 0-based) goes to prefill
worker i mod x and its handoff to decode worker i mod y. One ``step()``::

    every prefill worker with work: one step; new handoffs offered to their decode workers
    every decode worker: the transfers admitted at its last step move (export, import, the
        prefill worker frees its blocks; measured), then begin_step (those join the running
        set: the first step that starts after their transfer ended; new handoffs admitted),
        then one step if it has work

A handoff its decode worker can never run (``DecodeWorker.never_fits``: over its max_model_len or
its whole pool) is not offered: its prefill blocks are freed and it ends with token 1 and reason
cannot_fit, as kvplan's simulator ends it (docs/simulate.md, "Disaggregated targets").

``transfer_s`` maps each moved request's id to its measured copy (export + import, seconds; the
caller pops it). A transfer therefore overlaps the decode step it was admitted in, and between two ``step()``
calls an admitted handoff is in transfer with blocks on both sides (a cancel then frees both).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from engine.disagg.kv_blocks import layout_of
from engine.disagg.workers import DecodeWorker, Handoff, PrefillWorker
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput, StepStats
from engine.request import FinishReason, SamplingParams


class DisaggEngine:
    """The in-process disaggregated engine over engines made by ``workers.worker_engine``.

    Raises (at construction):
        ValueError: no prefill or no decode engine, or engines whose KV layouts differ (layers,
            block shape, dtype: a payload could not move between them).
    """

    def __init__(self, prefill: Sequence[LLMEngine], decode: Sequence[LLMEngine]):
        if not prefill or not decode:
            raise ValueError("workers: need at least one prefill and one decode engine")
        layouts = {layout_of(e.kv_cache) for e in (*prefill, *decode)}
        if len(layouts) != 1:
            raise ValueError(f"workers: KV layouts differ ({sorted(map(str, layouts))})")
        self.prefill = [PrefillWorker(e) for e in prefill]
        self.decode = [DecodeWorker(e) for e in decode]
        self._count = 0
        self._route: dict[str, tuple[int, int]] = {}  # request id -> (prefill worker, decode worker)
        self.transfer_s: dict[str, float] = {}  # request id -> its KV's measured copy (export + import), s
        self.prefill_stats: list[list[StepStats]] = [[] for _ in self.prefill]
        self.decode_stats: list[list[StepStats]] = [[] for _ in self.decode]

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Route and queue a request; returns its id. Raises as ``LLMEngine.add_request``."""
        i = self._count
        request_id = str(i) if request_id is None else request_id
        if request_id in self._route:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        self.prefill[i % len(self.prefill)].add_request(prompt_token_ids, params, request_id, arrival_time, cache_salt)
        self._count += 1
        self._route[request_id] = (i % len(self.prefill), i % len(self.decode))
        return request_id

    def abort(self, request_id: str) -> str | None:
        """Cancel a request in any phase, freeing its blocks on both sides; returns the phase
        (``prefill``, ``waiting``, ``transfer``, ``decode``) or None for an unknown id. A request
        aborted in prefill or decode comes out of a later ``step()`` (reason abort); one aborted
        between them does not."""
        route = self._route.get(request_id)
        if route is None:
            return None
        p, d = route
        phase = self.decode[d].abort(request_id)
        if phase == "decode":
            return phase
        held = request_id in self.prefill[p].scheduler.held
        self.prefill[p].abort(request_id)
        if phase is None:
            phase = "prefill" if not held else "waiting"
        if phase != "prefill":
            del self._route[request_id]
        return phase

    def has_unfinished(self) -> bool:
        return any(w.has_unfinished() for w in self.prefill) or any(w.has_unfinished() for w in self.decode)

    def step(self) -> list[RequestOutput]:
        """One step of every worker (see the module docstring); the requests finished in it."""
        finished: list[RequestOutput] = []
        for i, pw in enumerate(self.prefill):
            if pw.has_unfinished():
                done, handoffs, stats = pw.step()
                self.prefill_stats[i].append(stats)
                finished += done
                for h in handoffs:
                    dw = self.decode[self._route[h.request_id][1]]
                    if reason := dw.never_fits(h):  # ends here, its prefill blocks freed: nothing waits forever
                        pw.release(h.request_id)
                        finished.append(_cannot_fit(h, reason))
                    else:
                        dw.offer(h)
        for j, dw in enumerate(self.decode):
            for request_id in list(dw.in_transfer):
                source = self.prefill[self._route[request_id][0]]
                start = time.perf_counter()
                payload, before = source.export(request_id), dw.transfer_seconds
                dw.complete(request_id, payload, time.perf_counter() - start)
                self.transfer_s[request_id] = dw.transfer_seconds - before
                source.release(request_id)
            dw.begin_step()
            if dw.engine.has_unfinished():
                outputs, stats = dw.engine.step()
                self.decode_stats[j].append(stats)
                finished += outputs
        for out in finished:
            self._route.pop(out.request_id, None)
        return finished


def _cannot_fit(h: Handoff, reason: str) -> RequestOutput:
    """The client's answer for a handoff no decode worker can run: token 1 (already streamed) and
    finish reason cannot_fit."""
    return RequestOutput(
        request_id=h.request_id,
        prompt_token_ids=h.prompt_token_ids,
        output_token_ids=(h.first_token,),
        text=None,
        finish_reason=FinishReason.CANNOT_FIT,
        finish_detail=reason,
        arrival_time=h.arrival_time,
        first_scheduled_time=h.first_scheduled_time,
        token_times=(h.first_token_time,),
        finish_time=time.perf_counter(),
        num_preemptions=0,
        num_cached_tokens=h.num_cached_tokens,
    )
