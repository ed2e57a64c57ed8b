"""The load client's workers: streaming HTTP requests on an asyncio loop, chunks timestamped as
they arrive, and nothing else on the hot path.

A worker is one event loop (aiohttp on uvloop, one connection per stream) on its own thread, in this
process or in a worker process of its own; kvplan.run.server.backend spreads requests over
workers. Messages in and out are plain picklable tuples::

    in:  ("req", HttpRequest) | ("stats",) | ("stop",)
    out: ("done", HttpResult) | ("stats", lag samples in s, loop CPU s since the last ask)

On the hot path a worker only reads bytes, splits server-sent events and stamps each event with
``time.perf_counter()`` (one clock for every process of the machine); JSON is parsed later, off
the loop (kvplan.run.server.sse). A 5 ms timer measures the loop's lag: how late it
fires is how late a chunk that arrived meanwhile can be stamped, the client's own error
(kvplan.run.server.client_lag judges it).

Test only: ``KVPLAN_TEST_LOOP_BLOCK=B/P`` (milliseconds) makes every worker's loop block itself
for B ms once every P ms (``time.sleep`` on the loop thread), the stalled client that the
"client behind" rule must catch. Nothing else reads it; never set it in a real run.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import aiohttp

LAG_TICK_S = 0.005
BLOCK_ENV = "KVPLAN_TEST_LOOP_BLOCK"  # test only (see the module docstring)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (libuv; its I/O callbacks cost a fraction of
    asyncio's own), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


@dataclass(frozen=True)
class HttpRequest:
    """One request to send: ``body`` is the JSON body, ``url`` the full endpoint."""

    request_id: str
    url: str
    body: bytes


@dataclass(frozen=True)
class HttpResult:
    """What came back: ``events`` are the SSE ``data:`` payloads with their arrival times (or, for
    a non-streaming answer, one payload); ``error`` is "" or why the request failed (``http 429``,
    ``timeout``, ``connection refused``, ``connection dropped``); ``status`` the HTTP status
    (0 when none came). ``detail``: the start of an error body."""

    request_id: str
    sent_time: float
    end_time: float
    status: int
    events: tuple[tuple[float, bytes], ...]
    error: str = ""
    detail: str = ""


class Worker:
    """One event loop's share of the streams (see the module docstring). ``emit`` is called
    from the loop thread with each outgoing message."""

    def __init__(self, emit: Callable[[tuple], None], headers: dict[str, str], timeout_s: float):
        self.emit, self.headers, self.timeout_s = emit, headers, timeout_s
        self.loop = new_event_loop()
        self.lags: list[float] = []
        self._cpu_mark = 0.0
        self._session: aiohttp.ClientSession | None = None  # set on the loop thread before start() returns
        self._tasks: set = set()
        self.thread = threading.Thread(target=self._run, name="kvplan-client", daemon=True)
        self._ready = threading.Event()

    def start(self) -> None:
        self.thread.start()
        self._ready.wait()

    def post(self, message: tuple) -> None:
        """From any thread: hand ``message`` to the loop."""
        self.loop.call_soon_threadsafe(self._handle, message)

    # ---- on the loop thread ------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        self._stopped = asyncio.Event()
        self._cpu_mark = time.thread_time()
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=self.headers, auto_decompress=False
        ) as session:
            self._session = session
            lag = asyncio.ensure_future(self._watch_lag())
            blocker = _test_blocker()
            self._ready.set()
            await self._stopped.wait()
            lag.cancel()
            if blocker is not None:
                blocker.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "req":
            task = self.loop.create_task(self._stream(message[1]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif kind == "stats":
            now = time.thread_time()
            lags, self.lags = self.lags, []
            self.emit(("stats", lags, now - self._cpu_mark))
            self._cpu_mark = now
        elif kind == "stop":
            self._stopped.set()

    async def _watch_lag(self) -> None:
        clock = time.perf_counter
        while True:
            due = clock() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            self.lags.append(max(0.0, clock() - due))

    async def _stream(self, req: HttpRequest) -> None:
        events: list[tuple[float, bytes]] = []
        sent = time.perf_counter()
        for _ in range(2):
            status, error, detail = await self._post(req, events)
            if error != "connection dropped" or status or events:
                break
        self.emit(("done", HttpResult(req.request_id, sent, time.perf_counter(), status, tuple(events), error, detail)))

    async def _post(self, req: HttpRequest, events: list[tuple[float, bytes]]) -> tuple[int, str, str]:
        """One POST of ``req``, its SSE events appended to ``events``: (status, error, detail).

        A kept-alive connection the server closed after its last answer fails at once with no
        status ("connection dropped"); the caller sends such a request once more, on a fresh
        connection, as curl and urllib3 do. llama.cpp's llama-server (tools/server/server-http.cpp
        on cpp-httplib) announces ``Keep-Alive`` yet closes the connection after each streamed
        answer, so without this every second request of a stream failed."""
        import aiohttp

        clock = time.perf_counter
        status, error, detail = 0, "", ""
        assert self._session is not None  # _main opens it before any request is taken
        try:
            async with self._session.post(req.url, data=req.body, headers={"Content-Type": "application/json"}) as resp:
                status = resp.status
                if status != 200:
                    error = f"http {status}"
                    detail = (await resp.content.read(400)).decode("utf-8", "replace")
                elif resp.content_type != "text/event-stream":
                    events.append((clock(), await resp.read()))
                else:
                    buffer, sep = b"", b"\n\n"
                    async for data in resp.content.iter_any():
                        now = clock()
                        buffer += data
                        if b"\r" in data:  # an endpoint that ends lines with CRLF
                            buffer, sep = buffer.replace(b"\r\n", b"\n"), b"\n\n"
                        while (end := buffer.find(sep)) >= 0:
                            event, buffer = buffer[:end], buffer[end + 2 :]
                            for line in event.split(b"\n"):
                                if line.startswith(b"data:"):
                                    events.append((now, line[5:].strip()))
        except TimeoutError:
            error = "timeout"
        except aiohttp.ClientConnectorError as err:
            error, detail = "connection refused", str(err)[:200]
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as err:
            error, detail = "connection dropped", str(err)[:200]
        except aiohttp.ClientError as err:
            error, detail = "client error", f"{type(err).__name__}: {err}"[:200]
        except asyncio.CancelledError:
            error = "cancelled"
        return status, error, detail


def _test_blocker() -> asyncio.Future | None:
    """The test hook of the module docstring: a task blocking the running loop, or None."""
    setting = os.environ.get(BLOCK_ENV)
    if not setting:
        return None
    block_ms, period_ms = (float(v) for v in setting.split("/"))

    async def block() -> None:
        while True:
            await asyncio.sleep(max(0.0, period_ms - block_ms) / 1e3)
            time.sleep(block_ms / 1e3)  # blocks the loop on purpose

    return asyncio.ensure_future(block())


def rejection(result: HttpResult) -> str | None:
    """Why the server refused a request it answered HTTP 429 (its admission, a rate limit): the
    message of its OpenAI-style error body (engine.serve's starts with its reason code:
    ``kv_budget: ...``), else ``http 429``; None for any other answer. Such a request is shed,
    not failed (finish_reason ``rejected``, kvplan.results.stats.shed); the client does not retry it."""
    if result.status != 429:
        return None
    try:
        message = json.loads(result.detail)["error"]["message"]
    except (ValueError, TypeError, KeyError):
        return "http 429"
    return str(message)[:200] if message else "http 429"


# ---- a worker in a process of its own ---------------------------------------------------------
def process_main(inbox, outbox, headers: dict[str, str], timeout_s: float) -> None:
    """Entry point of a worker process: relays ``inbox`` (a multiprocessing queue) to its loop,
    the loop's messages to ``outbox``, until ("stop",)."""
    worker = Worker(outbox.put, headers, timeout_s)
    worker.start()
    while True:
        message = inbox.get()
        worker.post(message)
        if message[0] == "stop":
            break
    worker.thread.join(timeout=30)


class ThreadInbox:
    """The in-process worker's inbox, shaped like a multiprocessing queue's ``put``."""

    def __init__(self, worker: Worker):
        self.worker = worker

    def put(self, message: tuple) -> None:
        self.worker.post(message)


def in_process_worker(
    outbox: queue.SimpleQueue, headers: dict[str, str], timeout_s: float
) -> tuple[Worker, ThreadInbox]:
    worker = Worker(outbox.put, headers, timeout_s)
    worker.start()
    return worker, ThreadInbox(worker)
