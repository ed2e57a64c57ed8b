"""A server that announces keep-alive but closes each connection after one streamed answer, as
llama.cpp's llama-server does (seen against a real one: curl reports "Connection died, retrying
a fresh connect" on the second request of a connection). The client must send such a request
again on a fresh connection, not count it as failed."""

import asyncio
import queue
import threading

from kvplan.run.server.client import HttpRequest, Worker

ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Keep-Alive: timeout=5, max=100\r\n\r\n"
)


def sse_chunk(payload: bytes) -> bytes:
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


class OneAnswerPerConnection:
    """Answers the first request of each connection, then waits for the next one on it and closes
    the connection without a word (the client had already reused it)."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.answered, self.unanswered = 0, 0
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _read_request(self, reader):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(v)
            for k, v in (ln.split(b":", 1) for ln in head.split(b"\r\n")[1:] if b":" in ln)
            if k.lower() == b"content-length"
        )
        await reader.readexactly(length)

    async def _handle(self, reader, writer):
        try:
            await self._read_request(reader)
            writer.write(ANSWER + sse_chunk(b'{"choices":[{"text":"x","finish_reason":"length"}]}'))
            writer.write(sse_chunk(b"[DONE]") + b"0\r\n\r\n")
            await writer.drain()
            self.answered += 1
            await self._read_request(reader)  # the client reused the connection
            self.unanswered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def stop(self):
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_a_request_on_a_connection_the_server_closed_is_sent_again():
    server = OneAnswerPerConnection()
    done: queue.Queue = queue.Queue()
    worker = Worker(done.put, {}, timeout_s=10)
    worker.start()
    try:
        results = []
        for i in range(3):  # one after another, so each reuses the connection of the one before
            worker.post(("req", HttpRequest(f"r{i}", f"http://127.0.0.1:{server.port}/v1/completions", b"{}")))
            results.append(done.get(timeout=10)[1])
    finally:
        worker.post(("stop",))
        worker.thread.join(timeout=10)
        server.stop()
    assert [(r.status, r.error, r.events[-1][1] if r.events else None) for r in results] == [(200, "", b"[DONE]")] * 3
    # the 2nd and 3rd went first on the connection the server then closed: sent again, answered
    assert (server.answered, server.unanswered) == (3, 2)
