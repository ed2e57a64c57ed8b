"""A fast fake OpenAI-compatible server for client tests and the client bench (raw asyncio, no
framework, so its own cost stays small).

``POST /v1/completions`` and ``/v1/chat/completions`` stream ``max_tokens`` tokens, one chunk
every ``interval_s`` seconds, each chunk carrying ``tokens_per_chunk`` tokens as text and
``"t"``: ``time.perf_counter()`` just before it was written (one clock for every process on the
machine), so a client's timestamp error per chunk is its stamp minus ``t``. Options set how it
misbehaves: ``role_chunk`` (a role-only first chunk, as transformers serve sends), ``usage``
(a usage chunk when asked), ``status`` (answer every request with this HTTP status),
``drop_after`` (close the connection after that many chunks), ``api_key`` (401 without it),
``die_after`` (the whole server goes away after that many requests started), ``metrics``
(serve vLLM-style /metrics whose ``vllm:num_preemptions_total`` counts requests
served, and ``cache_config_info`` with 48 blocks of 4 tokens), ``flavor`` (whose /metrics:
``vllm``; ``sglang`` with ``sglang:cache_config_info`` pages; ``sglang-old``, token_usage and
max_total_num_tokens only; ``llamacpp``, llama-server's names as its builds before PR #13660
had them, plus ``/props`` and ``/slots`` of ``slots`` slots of ``slot_ctx`` tokens),
``first_token_s`` (a prefill: the first chunk waits that long) and ``reasoning_chunks`` (the
first that many chunks carry ``delta.reasoning_content``, chat only). ``GET /v1/models`` lists
``model``.

Run it in a thread (``FakeServer(...).start()``) or alone:
``python tests/kvplan/run/server/fake_server.py --interval-ms 50`` prints its URL (alone it runs on
uvloop where installed). Each stream keeps a schedule (chunk i at its start + i x interval) and
writes pre-encoded chunk bytes, so its rate holds and its own cost per chunk stays a few us.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import threading
import time
from dataclasses import dataclass


@dataclass
class Options:
    model: str = "fake-model"
    interval_s: float = 0.001
    tokens_per_chunk: int = 1
    role_chunk: bool = False
    usage: bool = True
    status: int = 200
    drop_after: int | None = None
    api_key: str | None = None
    metrics: bool = True
    owned_by: str = "vllm"
    die_after: int | None = None  # stop listening and drop every connection after this many requests
    flavor: str = "vllm"  # vllm | sglang | sglang-old | llamacpp: whose /metrics (and /props) it serves
    first_token_s: float = 0.0
    reasoning_chunks: int = 0
    slots: int = 4
    slot_ctx: int = 512


class FakeServer:
    def __init__(self, options: Options | None = None, host: str = "127.0.0.1", port: int = 0):
        self.options = options or Options()
        self.host, self.port = host, port
        self.served = 0
        self.generated = 0  # tokens streamed by finished requests (the token counters of /metrics)
        self.bodies: list[dict] = []
        self._writers: set = set()
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> FakeServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        """Close the listening socket, end every open connection's handler (cancelled, its writer
        closed while the loop still runs: a handler left pending on a kept-alive connection was
        destroyed with the stopped loop, a warning at the end of the suite), then stop the loop."""

        async def shut() -> None:
            self._server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(shut(), self.loop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, self.host, self.port, backlog=4096)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    async def serve_forever(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        print(f"fake server on {self.url}", flush=True)
        await self._server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                keep = await self._respond(method, path, headers, body, writer)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def _plain(self, writer, status: int, payload: bytes, kind: str = "application/json") -> None:
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload
        )

    async def _respond(self, method: str, path: str, headers: dict, body: bytes, writer) -> bool:
        o = self.options
        if path.startswith("/v1") and o.api_key and headers.get("authorization") != f"Bearer {o.api_key}":
            self._plain(writer, 401, b'{"error": {"message": "bad key"}}')
            return True
        if method == "GET" and path == "/v1/models":
            self._plain(
                writer,
                200,
                json.dumps(
                    {"object": "list", "data": [{"id": o.model, "object": "model", "owned_by": o.owned_by}]}
                ).encode(),
            )
            return True
        if method == "GET" and path == "/metrics" and o.metrics:
            self._plain(writer, 200, _metrics(o, self.served, self.generated).encode(), "text/plain")
            return True
        if method == "GET" and path == "/props" and o.flavor == "llamacpp":
            props = {"default_generation_settings": {"n_ctx": o.slot_ctx}, "total_slots": o.slots}
            self._plain(writer, 200, json.dumps(props).encode())
            return True
        if method == "GET" and path == "/slots" and o.flavor == "llamacpp":
            self._plain(writer, 200, json.dumps([{"id": i, "n_ctx": o.slot_ctx} for i in range(o.slots)]).encode())
            return True
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            self._plain(writer, 404, b'{"detail": "Not Found"}')
            return True
        request = json.loads(body)
        self.bodies.append(request)
        if o.die_after is not None and len(self.bodies) > o.die_after:
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            return False
        if o.status != 200:
            self._plain(writer, o.status, b'{"error": {"message": "refused"}}')
            return True
        chat = path.endswith("chat/completions")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        n, sent, k = int(request.get("max_tokens", 16)), 0, o.tokens_per_chunk
        if chat and o.role_chunk:
            writer.write(b'data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n')
        clock, loop = time.perf_counter, asyncio.get_running_loop()
        start = loop.time() + o.first_token_s
        while sent < n:
            # chunk i is due at start + i * interval (a schedule, so the rate holds however long a write took)
            await asyncio.sleep(max(0.0, start + (sent // k + 1) * o.interval_s - loop.time()))
            if o.drop_after is not None and sent >= o.drop_after:
                self.served += 1
                return False
            take = min(k, n - sent)
            sent += take
            head = _chunk_head(chat, take, sent >= n, chat and sent <= o.reasoning_chunks * k)
            writer.write(b"%s%r}\n\n" % (head, clock()))  # t: just before the write
            if writer.transport.get_write_buffer_size():
                await writer.drain()
        if o.usage and (request.get("stream_options") or {}).get("include_usage"):
            writer.write(f'data: {{"choices":[],"usage":{{"prompt_tokens":7,"completion_tokens":{n}}}}}\n\n'.encode())
        writer.write(b"data: [DONE]\n\n")
        self.served += 1
        self.generated += n
        return False


def _metrics(o: Options, served: int, generated: int) -> str:
    """The /metrics text of ``o.flavor``: preemption counters count requests served, token
    counters the tokens they streamed (7 prompt tokens each), usage is 0.25."""
    if o.flavor == "llamacpp":  # llama-server's names (tools/server/README.md, builds before PR #13660)
        return (
            f"llamacpp:prompt_tokens_total {7 * served}\nllamacpp:tokens_predicted_total {generated}\n"
            "llamacpp:kv_cache_usage_ratio 0.25\nllamacpp:kv_cache_tokens 128\n"
            "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n"
        )
    if o.flavor.startswith("sglang"):
        pool = (
            'sglang:max_total_num_tokens{model_name="m"} 200.0\nsglang:page_size{model_name="m"} 1.0\n'
            if o.flavor == "sglang-old"
            else 'sglang:cache_config_info{page_size="16",num_pages="12"} 1.0\n'
            'sglang:full_token_usage{model_name="m"} 0.25\nsglang:mamba_usage{model_name="m"} 0.5\n'
        )
        return pool + (
            'sglang:token_usage{model_name="m"} 0.5\n'
            f'sglang:num_retracted_requests_total{{model_name="m"}} {float(served)}\n'
            f'sglang:generation_tokens_total{{model_name="m"}} {float(generated)}\n'
        )
    return (
        'vllm:cache_config_info{block_size="4",num_gpu_blocks="48",cache_dtype="auto"} 1.0\n'
        f'vllm:num_preemptions_total{{model_name="{o.model}"}} {float(served)}\n'
        f'vllm:kv_cache_usage_perc{{model_name="{o.model}"}} 0.25\n'
    )


@functools.cache
def _chunk_head(chat: bool, num_tokens: int, last: bool, reasoning: bool = False) -> bytes:
    """A chunk's bytes up to its ``t`` value (pre-encoded: the server's cost per chunk stays small)."""
    text, done = "x " * num_tokens, '"length"' if last else "null"
    key = "reasoning_content" if reasoning else "content"
    choice = (
        f'{{"index":0,"delta":{{"{key}":"{text}"}},"finish_reason":{done}}}'
        if chat
        else f'{{"index":0,"text":"{text}","finish_reason":{done}}}'
    )
    return f'data: {{"choices":[{choice}],"t":'.encode()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--interval-ms", type=float, default=1.0)
    args = p.parse_args()
    server = FakeServer(Options(interval_s=args.interval_ms / 1e3), port=args.port)
    try:  # a fast local server: uvloop where installed
        import uvloop
    except ImportError:
        asyncio.run(server.serve_forever())
    else:
        uvloop.run(server.serve_forever())


if __name__ == "__main__":
    main()
