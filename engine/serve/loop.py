"""One engine loop for every stream of ``python -m engine.serve``.

The ``LLMEngine`` lives on one thread; HTTP handlers (on the asyncio loop) only post to it::

    handler --submit(job, sink)--> inbox --> loop thread: add_request / abort
                                             while requests are unfinished: engine.step()
    handler <--Update per step-- call_soon_threadsafe (one call per step, every stream's updates)

After each step the loop reads each live request's new output tokens, decodes the new text
(held back while it ends inside a multi-byte character) and posts one ``Update`` per request
with new tokens or a finish. ``abort(request_id)`` (a client that went away) finishes the request
in the engine and frees its blocks before the next step. A model without a tokenizer streams each
token id as the text ``<id>``. Metrics (kvplan-free, vLLM's names) are updated after every step.

With admission on (engine.admission), ``submit`` takes an ``admitted`` callback too: the loop
thread calls it (on the caller's loop) right after ``add_request`` with None, or with the
refusal (``"<reason>: ..."``) of a request admission refused, which then never goes live and
counts in ``/metrics`` by its reason at once.

The loop thread runs the model with torch's threads as ``python -m engine.serve``'s main thread had
them before it gave them up (engine.serve.threads: one OpenMP team in the process, on this thread).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from engine.admission import reason_of
from engine.request import FinishReason, Request
from engine.serve import threads
from engine.serve.api import Job


@dataclass(frozen=True)
class Update:
    """New output for one request: ``text`` decoded since the last update, ``num_new_tokens``
    tokens; ``finish_reason`` set on its last update (stop, length, abort, oom, cannot_fit)."""

    text: str
    num_new_tokens: int
    num_output_tokens: int
    num_prompt_tokens: int
    finish_reason: str | None = None


@dataclass
class _Live:
    job: Job
    deliver: Callable[[Update], None]
    loop: asyncio.AbstractEventLoop
    admitted: Callable[[str | None], None] | None = None  # told the admission decision, when admission is on
    request: Request | None = None  # read after each step; set when the loop thread adds the job
    num_sent: int = 0
    text_sent: str = ""


class EngineLoop:
    """Owns one ``LLMEngine`` on its own thread (see the module docstring)."""

    def __init__(self, engine, metrics=None) -> None:
        self.engine, self.metrics = engine, metrics
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, name="engine-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout=10)

    def submit(
        self, job: Job, deliver: Callable[[Update], None], admitted: Callable[[str | None], None] | None = None
    ) -> str:
        """Queue ``job``; ``deliver`` is called on the caller's asyncio loop with each Update, and
        ``admitted`` once with the admission decision (None: admitted; else the refusal)."""
        request_id = f"cmpl-{next(self._ids)}"
        self._inbox.put(("add", request_id, _Live(job, deliver, asyncio.get_running_loop(), admitted)))
        return request_id

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id, None))

    # ---- the loop thread ---------------------------------------------------------------
    def _thread_main(self) -> None:
        threads.adopt()  # torch's OpenMP team lives on this thread (engine.serve.threads)
        self._run()

    def _run(self) -> None:
        engine = self.engine
        while not self._stop.is_set():
            if not engine.has_unfinished():  # idle: block until something arrives
                self._take(self._inbox.get())
            while True:
                try:
                    self._take(self._inbox.get_nowait())
                except queue.Empty:
                    break
            if not engine.has_unfinished():
                continue
            outputs, stats = engine.step()
            generated = self._post({o.request_id: o for o in outputs})
            if self.metrics is not None:
                self.metrics.observe_step(stats, outputs, generated)

    def _take(self, item: tuple | None) -> None:
        if item is None:  # stop() wakes the loop
            return
        op, request_id, live = item
        if op == "abort":
            if request_id in self._live:
                self.engine.abort(request_id)
            return
        job = live.job
        self.engine.add_request(
            list(job.prompt_token_ids), job.params, request_id=request_id, cache_salt=job.cache_salt, tenant=job.tenant
        )
        live.request = request = self.engine.scheduler.get_request(request_id)
        refusal = request.finish_detail if request.finish_reason == FinishReason.REJECTED else None
        if live.admitted is not None:
            try:
                live.loop.call_soon_threadsafe(live.admitted, refusal)
            except RuntimeError:  # the server's loop closed under us (shutdown)
                pass
        if refusal is not None:
            if self.metrics is not None:
                self.metrics.observe_rejected(reason_of(refusal))
            return
        self._live[request_id] = live

    def _post(self, finished: dict) -> int:
        """Send each live request the tokens it gained this step (and its end); returns how many
        tokens were generated in all, the first of a request included."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        generated = 0
        for request_id, live in list(self._live.items()):
            out = finished.get(request_id)
            assert live.request is not None  # _take sets it before the request goes live
            ids = live.request.output_token_ids
            if len(ids) == live.num_sent and out is None:
                continue
            text = self._new_text(live, ids, final=out is not None)
            new = len(ids) - live.num_sent
            generated += new
            live.num_sent = len(ids)
            update = Update(
                text, new, len(ids), len(live.job.prompt_token_ids), out.finish_reason if out is not None else None
            )
            by_loop.setdefault(live.loop, []).append((live.deliver, update))
            if out is not None:
                del self._live[request_id]
        for loop, updates in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver_all, updates)
            except RuntimeError:  # the server's loop closed under us (shutdown)
                pass
        return generated

    def _new_text(self, live: _Live, ids: list[int], final: bool) -> str:
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            return "".join(f"<{t}>" for t in ids[live.num_sent :])
        full = tokenizer.decode(ids, skip_special_tokens=True)
        if full.endswith("\ufffd") and not final:  # inside a multi-byte character: wait for the rest
            return ""
        new = full[len(live.text_sent) :] if full.startswith(live.text_sent) else full
        live.text_sent = full
        return new


def _deliver_all(updates: list) -> None:
    for deliver, update in updates:
        deliver(update)
