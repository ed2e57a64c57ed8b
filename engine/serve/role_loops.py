"""The engine loops of a prefill and a decode server (``python -m engine.serve --role``), around
engine.disagg's ``PrefillWorker`` and ``DecodeWorker`` (their logic is not repeated here).

As in engine.serve.loop, the worker lives on one thread and HTTP handlers only post to it::

    PrefillLoop: add -> worker.step() until token 1 -> the handler gets a PrefillResult (token 1's
                 text and a Handoff whose blocks the worker holds, or the request's end);
                 export (the held blocks as bytes), release (free them), abort
    DecodeLoop:  offer(handoff, source URL) -> at each step start worker.begin_step(): admitted
                 handoffs are fetched from the source on a transfer thread (``fetch``, measured),
                 the source told to free them, the bytes written in (worker.complete), and they
                 join the running set at the next step; then token 2.. stream as Updates

An abort names a request id; one that arrives before its add/offer is remembered (the add is then
answered ``abort`` at once), so a router's cancel never races a request into holding blocks.
A decode server that drops a handoff before its KV arrived (abort, failed fetch) tells the
source to free it. Times are ``time.perf_counter()`` (one clock for every process of a machine).
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from engine.disagg.workers import DecodeWorker, Handoff, PrefillWorker
from engine.request import SamplingParams
from engine.serve.api import Job
from engine.serve.loop import EngineLoop, Update, _Live

MAX_TOMBSTONES = 4096  # aborts remembered for ids not seen yet


def handoff_json(h: Handoff) -> dict:
    """A Handoff as JSON-ready data (``handoff_from``'s inverse)."""
    return asdict(h)


def handoff_from(data: dict) -> Handoff:
    """A Handoff from ``handoff_json``'s data. Raises TypeError/ValueError on a malformed one."""
    params = dict(data["params"])
    if params.get("forced_token_ids") is not None:
        params["forced_token_ids"] = tuple(params["forced_token_ids"])
    return Handoff(**{**data, "prompt_token_ids": tuple(data["prompt_token_ids"]), "params": SamplingParams(**params)})


@dataclass(frozen=True)
class PrefillResult:
    """What a prefill server answers: token 1's ``text``; ``handoff`` when the decode server is to
    go on (its blocks held here), else ``finish_reason`` (stop, length, abort)."""

    text: str
    num_prompt_tokens: int
    handoff: Handoff | None
    finish_reason: str | None


class _Tombstones:
    def __init__(self) -> None:
        self._ids: deque[str] = deque(maxlen=MAX_TOMBSTONES)

    def add(self, request_id: str) -> None:
        self._ids.append(request_id)

    def take(self, request_id: str) -> bool:
        if request_id in self._ids:
            self._ids.remove(request_id)
            return True
        return False


def _call(loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the server's loop closed under us (shutdown)
        pass


class PrefillLoop(EngineLoop):
    """A ``PrefillWorker`` on its own thread (see the module docstring); ``metrics``: DisaggMetrics."""

    def __init__(self, worker: PrefillWorker, metrics=None) -> None:
        super().__init__(worker.engine, metrics)
        self.worker = worker
        self._gone = _Tombstones()

    def submit_as(self, request_id: str, job: Job, deliver: Callable[[PrefillResult], None]) -> None:
        """Queue ``job`` under the router's ``request_id``; ``deliver`` gets one PrefillResult."""
        live = _Live(job, deliver, asyncio.get_running_loop())  # type: ignore[arg-type]  # one PrefillResult
        self._inbox.put(("add", request_id, live))

    def export(self, request_id: str, done: Callable[[bytes | None], None]) -> None:
        """Read a held request's blocks; ``done`` gets the bytes (None: not held here)."""
        self._inbox.put(("export", request_id, (done, asyncio.get_running_loop())))

    def release(self, request_id: str) -> None:
        self._inbox.put(("release", request_id, None))

    def _run(self) -> None:
        worker = self.worker
        while not self._stop.is_set():
            if not worker.has_unfinished():
                self._take(self._inbox.get())
            while True:
                try:
                    self._take(self._inbox.get_nowait())
                except queue.Empty:
                    break
            if worker.has_unfinished():
                done, handoffs, stats = worker.step()
                for out in done:
                    self._answer(out.request_id, out.output_token_ids, None, out.finish_reason)
                for h in handoffs:
                    self._answer(h.request_id, [h.first_token], h, None)
                if self.metrics is not None:
                    self.metrics.observe_step(stats, done, sum(len(o.output_token_ids) for o in done) + len(handoffs))
            if self.metrics is not None:
                self.metrics.held.set(len(worker.scheduler.held))

    def _answer(self, request_id: str, ids, handoff: Handoff | None, reason: str | None) -> None:
        live = self._live.pop(request_id, None)
        if live is None:  # its client went away meanwhile: nothing to hold for
            if handoff is not None:
                self.worker.release(request_id)
            return
        text = self._new_text(live, list(ids), final=handoff is None)
        _call(live.loop, live.deliver, PrefillResult(text, len(live.job.prompt_token_ids), handoff, reason))

    def _take(self, item: tuple | None) -> None:
        if item is None:
            return
        op, request_id, arg = item
        if op == "add":
            live: _Live = arg
            if self._gone.take(request_id):
                _call(live.loop, live.deliver, PrefillResult("", len(live.job.prompt_token_ids), None, "abort"))
                return
            job = live.job
            self.worker.add_request(list(job.prompt_token_ids), job.params, request_id, cache_salt=job.cache_salt)
            self._live[request_id] = live
        elif op == "export":
            done, loop = arg
            payload = None
            if request_id in self.worker.scheduler.held:
                payload = self.worker.export(request_id)
                if self.metrics is not None:
                    self.metrics.observe_moved(len(self.worker.scheduler.held[request_id]), len(payload))
            _call(loop, done, payload)
        elif op == "release":
            self.worker.release(request_id)
        elif op == "abort":
            if request_id in self._live:
                self.worker.abort(request_id)  # in prefill: it comes out of the next step as aborted
            elif request_id in self.worker.scheduler.held:
                self.worker.release(request_id)
            else:
                self._gone.add(request_id)


class DecodeLoop(EngineLoop):
    """A ``DecodeWorker`` on its own thread (see the module docstring). ``fetch(source, request_id)``
    returns the held blocks' bytes from the prefill server at ``source`` (raises OSError);
    ``release(source, request_id)`` tells it to free them. Both run on transfer threads."""

    def __init__(
        self,
        worker: DecodeWorker,
        fetch: Callable[[str, str], bytes],
        release: Callable[[str, str], None],
        metrics=None,
        transfer_threads: int = 8,
    ) -> None:
        super().__init__(worker.engine, metrics)
        self.worker, self.fetch, self.release = worker, fetch, release
        self._pending: dict[str, tuple[_Live, str, str]] = {}  # offered, not joined: live, source, first text
        self._gone = _Tombstones()
        self.transfer_s: dict[str, float] = {}  # request id -> its transfer's seconds (read by the handler)
        self._pool = ThreadPoolExecutor(transfer_threads, thread_name_prefix="kv-transfer")

    def offer(
        self, handoff: Handoff, source: str, job: Job, deliver: Callable[[Update], None], first_text: str
    ) -> None:
        """Queue a handoff whose blocks ``source`` holds; ``deliver`` gets Updates from token 2 on
        (``first_text``: what the client was sent for token 1)."""
        live = _Live(job, deliver, asyncio.get_running_loop())
        self._inbox.put(("offer", handoff.request_id, (handoff, source, live, first_text)))

    def stop(self) -> None:
        super().stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        worker, engine = self.worker, self.engine
        while not self._stop.is_set():
            if not engine.has_unfinished():  # nothing to step until an offer, a transfer end or an abort
                self._take(self._inbox.get())
            while True:
                try:
                    self._take(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for h in worker.begin_step():
                self._pool.submit(self._transfer, h.request_id, self._pending[h.request_id][1])
            for request_id in [r for r in self._pending if engine.scheduler.knows(r)]:  # joined this step start
                live, _, first_text = self._pending.pop(request_id)
                live.request, live.num_sent, live.text_sent = engine.scheduler.get_request(request_id), 1, first_text
                self._live[request_id] = live
            if self.metrics is not None:
                self.metrics.handoffs_waiting.set(worker.num_waiting_handoffs)
                self.metrics.in_transfer.set(len(worker.in_transfer))
            if engine.has_unfinished():
                outputs, stats = engine.step()
                generated = self._post({o.request_id: o for o in outputs})
                if self.metrics is not None:
                    self.metrics.observe_step(stats, outputs, generated)

    def _transfer(self, request_id: str, source: str) -> None:
        """On a transfer thread: fetch the blocks, tell the source to free them, hand them to the loop."""
        start = time.perf_counter()
        try:
            payload: bytes | None = self.fetch(source, request_id)
        except OSError:
            payload = None
        seconds = time.perf_counter() - start
        if payload is not None:
            self._release(source, request_id)
        self._inbox.put(("complete", request_id, (payload, seconds)))

    def _release(self, source: str, request_id: str) -> None:
        try:
            self.release(source, request_id)
        except OSError:
            pass  # the source is gone: nothing is held there any more

    def _take(self, item: tuple | None) -> None:
        if item is None:
            return
        op, request_id, arg = item
        worker = self.worker
        if op == "offer":
            handoff, source, live, first_text = arg
            if self._gone.take(request_id):
                self._drop(request_id, live, source)
                return
            self._pending[request_id] = (live, source, first_text)
            worker.offer(handoff)
        elif op == "complete":
            payload, seconds = arg
            if request_id not in worker.in_transfer:
                return  # aborted meanwhile: its blocks here are already free
            if payload is None:  # the fetch failed
                worker.abort(request_id)
                live, source, _ = self._pending.pop(request_id)
                self._drop(request_id, live, source)
                return
            before = worker.transfer_seconds
            worker.complete(request_id, payload, seconds)
            self.transfer_s[request_id] = worker.transfer_seconds - before
            if self.metrics is not None:
                self.metrics.observe_moved(
                    len(payload) // self.engine.bytes_per_block, len(payload), self.transfer_s[request_id]
                )
        elif op == "abort":
            phase = worker.abort(request_id)
            if phase in ("waiting", "transfer"):
                live, source, _ = self._pending.pop(request_id)
                self._drop(request_id, live, source)
            elif phase is None and request_id not in self._live:
                self._gone.add(request_id)

    def _drop(self, request_id: str, live: _Live, source: str) -> None:
        """A handoff that ends before its KV arrived: the source frees its blocks; the handler hears abort."""
        self._pool.submit(self._release, source, request_id)
        self.transfer_s.pop(request_id, None)
        n = len(live.job.prompt_token_ids)
        _call(live.loop, live.deliver, Update("", 0, 1, n, "abort"))
