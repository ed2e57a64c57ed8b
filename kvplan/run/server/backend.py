"""A remote OpenAI-compatible server as a load-test backend (kvplan.run.driver.Backend).

::

    driver.submit(Submission) -> request body (JSON) -> the least busy client worker
    worker (its own event loop; a thread here, or a process each when there are several):
        POST, stream, stamp each SSE event on arrival  -> ("done", HttpResult)
    driver.advance(until) <- results turned into Finished (kvplan.run.server.sse),
        blocking until one request finishes or the clock reaches ``until``

The clock is ``time.perf_counter()`` in every process. The body asks for greedy sampling, a
stream with a usage chunk, and ``max_tokens``; with ``exact`` also ``ignore_eos`` and
``min_tokens`` = ``max_tokens`` (vLLM's way to fix the output length), and ``cache_salt`` (a
digest of kvplan's salt: ``wire_salt``) where the server takes it (vLLM, engine.serve), so levels
never share prefix-cache blocks; then the workload's ``extra_body``. When a request fails because
nothing answers and the server's ``/v1/models`` no longer answers either, ``advance`` raises
``ServerGone``: the run stops there and keeps what finished.
"""

from __future__ import annotations

import hashlib
import json
import queue
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvplan.run.driver import Finished, RunStopped, Submission
from kvplan.run.server.client import HttpRequest, ThreadInbox, in_process_worker, process_main
from kvplan.run.server.preflight import get
from kvplan.run.server.sse import CountTokens, to_finished

if TYPE_CHECKING:
    from multiprocessing.queues import Queue as MpQueue

SALT_KINDS = ("vllm", "kvplan-engine")  # servers that take vLLM's cache_salt
# vLLM refuses a cache_salt over 128 characters or holding '@', '/', '\\' or NUL (HTTP 400; vLLM 0.32's
# request validation, docs/target.md): kvplan's salts hold '/' and the bucket's own name, so the wire
# carries a digest of each, the same for the same salt, 38 characters of [a-z0-9-].
WIRE_SALT_PREFIX = "kvplan-"


def wire_salt(salt: str) -> str:
    """The ``cache_salt`` sent for kvplan's salt ``salt``: ``kvplan-`` and the first 32 hex digits of
    its SHA-256, which every server that takes vLLM's cache_salt accepts. Equal salts give equal wire
    salts (so the requests that should share prefix blocks still do); distinct ones differ but for a
    2**-128 chance."""
    return WIRE_SALT_PREFIX + hashlib.sha256(salt.encode()).hexdigest()[:32]


class ServerGone(RunStopped):
    """The server stopped answering mid-run."""


@dataclass(frozen=True)
class BodySpec:
    """How requests are written: API, model, prompt form, and what the server honours."""

    url: str  # the target's base URL (.../v1)
    api: str
    model: str
    exact: bool
    salt: bool
    extra_body: dict[str, Any]
    decode: Callable[[tuple[int, ...]], str] | None  # token ids -> text; None: send ids

    def endpoint(self) -> str:
        return f"{self.url}/chat/completions" if self.api == "chat" else f"{self.url}/completions"

    def body(self, sub: Submission) -> bytes:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": sub.max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        prompt: Any = self.decode(sub.prompt_token_ids) if self.decode is not None else list(sub.prompt_token_ids)
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.exact:
            body.update(ignore_eos=True, min_tokens=sub.max_tokens)
        if self.salt:
            body["cache_salt"] = wire_salt(sub.cache_salt)
        if sub.tenant is not None:  # OpenAI's end-user id: engine.serve's tenant (kvplan.workload.admission)
            body["user"] = sub.tenant
        body.update(self.extra_body)
        return json.dumps(body, separators=(",", ":")).encode()


class HttpBackend:
    """The driver's backend over ``workers`` client event loops (see the module docstring)."""

    def __init__(
        self, spec: BodySpec, headers: dict[str, str], timeout_s: float, workers: int, count_tokens: CountTokens | None
    ):
        self.spec, self.count_tokens, self.headers = spec, count_tokens, headers
        self.stopped_because: str | None = None
        # since the level started (kvplan.run.server.client_lag): each finished request's TTFT, s,
        # and, open loop, each send's delay after its scheduled arrival, s
        self.level_ttfts_s: list[float] = []
        self.level_send_delays_s: list[float] = []
        self.raw: list | None = None  # set to a list to keep every raw HttpResult (benches)
        self._meta: dict[str, tuple[float | None, int]] = {}  # request id -> (arrival time, prompt tokens)
        self._load: list[int] = [0] * workers
        self._where: dict[str, int] = {}
        self._pending: list[tuple] = []
        # one worker: a thread of this process; more: worker processes, over multiprocessing queues
        self._outbox: queue.SimpleQueue[Any] | MpQueue[Any]
        self._inboxes: list[ThreadInbox] | list[MpQueue[Any]]
        if workers == 1:
            # the loop shares this process's GIL with the driver: hand it over sooner than every 5 ms
            sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
            self._outbox = queue.SimpleQueue()
            worker, inbox = in_process_worker(self._outbox, headers, timeout_s)
            self._inboxes, self._procs, self._threads = [inbox], [], [worker]
        else:
            import multiprocessing as mp

            ctx = mp.get_context("spawn")
            self._outbox = ctx.Queue()
            self._inboxes = [ctx.Queue() for _ in range(workers)]
            self._procs = [
                ctx.Process(target=process_main, args=(q, self._outbox, headers, timeout_s), daemon=True)
                for q in self._inboxes
            ]
            self._threads = []
            for proc in self._procs:
                proc.start()

    @property
    def num_workers(self) -> int:
        return len(self._inboxes)

    def now(self) -> float:
        return time.perf_counter()

    def submit(self, submission: Submission) -> None:
        rid = submission.request_id
        i = min(range(len(self._load)), key=self._load.__getitem__)
        self._load[i] += 1
        self._where[rid] = i
        arrival = submission.arrival_time
        self._meta[rid] = (arrival, len(submission.prompt_token_ids))
        self._inboxes[i].put(("req", HttpRequest(rid, self.spec.endpoint(), self.spec.body(submission))))

    def _finish(self, result) -> Finished:
        arrival, num_prompt = self._meta.pop(result.request_id)
        self._load[self._where.pop(result.request_id)] -= 1
        if arrival is not None:
            self.level_send_delays_s.append(max(0.0, result.sent_time - arrival))
        out = to_finished(
            result,
            arrival_time=result.sent_time if arrival is None else arrival,
            num_prompt_tokens=num_prompt,
            count_tokens=self.count_tokens,
        )
        if out.token_times and out.finish_reason != "error":
            self.level_ttfts_s.append(out.token_times[0] - out.arrival_time)
        if result.error in ("connection refused", "connection dropped") and not self._alive():
            self.stopped_because = f"the server stopped answering ({result.error}: {result.detail[:120]})"
        return out

    def _alive(self) -> bool:
        try:
            status, _ = get(
                f"{self.spec.url}/models",
                self.headers.get("Authorization", "").removeprefix("Bearer ") or None,
                timeout_s=5.0,
            )
        except (OSError, ValueError):
            return False
        return status == 200

    def advance(self, until: float | None) -> tuple[list[Finished], list[Any]]:
        """Block until a request finishes or the clock reaches ``until``; no steps (a server's
        own state is read from its /metrics instead).

        Raises:
            ServerGone: the server stopped answering (the finished requests are returned first).
        """
        if self.stopped_because is not None:
            raise ServerGone(self.stopped_because)
        messages, self._pending = self._pending, []  # results that arrived while stats were collected
        if not messages:
            timeout = None if until is None else max(0.0, until - time.perf_counter())
            try:
                messages.append(self._outbox.get(timeout=timeout))
            except queue.Empty:
                return [], []
        while True:
            try:
                messages.append(self._outbox.get_nowait())
            except queue.Empty:
                break
        done = [m[1] for m in messages if m[0] == "done"]  # a stray stats reply is dropped
        if self.raw is not None:
            self.raw += done
        return [self._finish(result) for result in done], []

    def wait_until(self, when: float) -> None:
        time.sleep(max(0.0, when - time.perf_counter()))

    def client_stats(self) -> tuple[list[float], float]:
        """Every worker's loop lag samples (s) and CPU seconds since the last call."""
        for inbox in self._inboxes:
            inbox.put(("stats",))
        lags, cpu, replies = [], 0.0, 0
        while replies < len(self._inboxes):
            message = self._outbox.get(timeout=30)
            if message[0] == "done":
                self._pending.append(message)
                continue
            replies += 1
            lags += message[1]
            cpu += message[2]
        return lags, cpu

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(("stop",))
        for worker in self._threads:
            worker.thread.join(timeout=30)
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
