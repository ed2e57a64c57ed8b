"""``python -m engine.serve.router --prefill URL[,URL] --decode URL[,URL] [--port N]``: one
OpenAI-compatible endpoint in front of a disaggregated deployment of ``python -m engine.serve
--role prefill`` and ``--role decode`` servers (engine.serve.role_app).

Policy (docs/architecture.md#disagg): request i (0-based, in arrival order at the router) goes to
prefill server i mod x and its handoff to decode server i mod y. Per request::

    client --POST /v1/(chat/)completions--> router --/kv/prefill--> prefill server: token 1
    router --token 1 (streamed at once)--> client
    router --/kv/decode {handoff, source}--> decode server: admits it FIFO when its pool has the
           blocks, fetches them from the prefill server (which then frees them), decodes
    router <--token 2..-- decode server;  router --tokens--> client

Routes: ``POST /v1/completions`` and ``/v1/chat/completions`` (streaming or not, as the aggregated
server answers them), ``GET /v1/models`` (the first prefill server's), ``GET /health``, ``GET
/metrics``: the router's ``kvplan_router_requests_total`` (by server pair) and
``kvplan_router_kv_transfer_seconds``, then every server's own metrics read at that moment, each
sample labelled ``server="decode0"`` .. ``"prefill0"`` .. (decode servers first, so a reader that
takes the first ``vllm:cache_config_info`` gets a decode server's pool; a server that does not
answer is left out). Token 1 is streamed as soon as the prefill
server has it. The finishing chunk, the usage chunk (where asked) and a non-streamed answer carry
the extra field ``kv_transfer_s``: seconds the request's KV took to move (None: it ended at the prefill
server). A client that disconnects, at any point, aborts the request on both servers, which frees
its blocks there. A request its decode server could never run (over that server's max_model_len,
or more blocks than its whole KV pool: read once from its ``/v1/models``) is answered 400 by the
prefill server before any prefill, as the aggregated server answers it. Bad flags print one line
and exit 2.
"""

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import uuid

from engine.request import SamplingParams
from engine.serve.api import DECODE_LIMITS, Job, chunk, error_body, full_response, usage_chunk
from engine.serve.http_base import base_app, fail

CONNECT_TIMEOUT_S = 10.0


def parse_urls(flag: str, value: str) -> list[str]:
    """``URL[,URL]`` -> URLs without a trailing slash. Raises ValueError naming ``flag``."""
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    if not urls:
        raise ValueError(f"{flag}: names no server; give URL[,URL], e.g. http://127.0.0.1:8100")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{flag}: {url!r} is not an http(s) URL; e.g. http://127.0.0.1:8100")
    return urls


def build_router(prefill: list[str], decode: list[str], api_key: str | None = None):
    """The router's FastAPI app over the given server URLs (see the module docstring)."""
    import aiohttp
    from fastapi import Request
    from fastapi.responses import Response, StreamingResponse
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from starlette.background import BackgroundTask

    from engine.serve.disagg_metrics import TRANSFER_BUCKETS, merge_expositions

    registry = CollectorRegistry()
    routed = Counter(
        "kvplan_router_requests",
        "Requests routed, by prefill and decode server.",
        ["prefill", "decode"],
        registry=registry,
    )
    transfers = Histogram(
        "kvplan_router_kv_transfer_seconds",
        "KV transfer seconds per request.",
        buckets=TRANSFER_BUCKETS,
        registry=registry,
    )
    count = itertools.count()
    tag = uuid.uuid4().hex[:8]
    state: dict = {}
    background: set[asyncio.Task] = set()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            state["session"] = session
            yield
            await asyncio.gather(*background, return_exceptions=True)

    app = base_app("engine.serve.router", lifespan, api_key)

    @app.get("/metrics")
    async def prometheus():
        servers = [(f"decode{i}", u) for i, u in enumerate(decode)] + [
            (f"prefill{i}", u) for i, u in enumerate(prefill)
        ]

        async def read(url: str) -> str | None:
            try:
                async with state["session"].get(f"{url}/metrics") as resp:
                    return (await resp.text()) if resp.status == 200 else None
            except aiohttp.ClientError:
                return None

        texts = await asyncio.gather(*(read(url) for _, url in servers))
        try:
            merged = merge_expositions([(label, t) for (label, _), t in zip(servers, texts) if t is not None])
        except ValueError:
            merged = ""
        return Response(
            generate_latest(registry) + merged.encode(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.get("/v1/models")
    async def models():
        try:
            async with state["session"].get(f"{prefill[0]}/v1/models") as resp:
                return Response(await resp.read(), status_code=resp.status, media_type="application/json")
        except aiohttp.ClientError as err:
            return fail(f"prefill server {prefill[0]} did not answer ({type(err).__name__})", 502)

    def abort(request_id: str, servers: tuple[str, ...]) -> None:
        """Cancel ``request_id`` on ``servers`` (in the background: it runs on after the client left)."""

        async def send():
            for url in servers:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with state["session"].post(f"{url}/kv/abort/{request_id}") as resp:
                        await resp.read()

        task = asyncio.get_running_loop().create_task(send())
        background.add(task)
        task.add_done_callback(background.discard)

    pools: dict[str, dict[str, int]] = {}  # decode URL -> its limits as the prefill server's query parameters

    async def decode_limits(url: str) -> dict[str, int]:
        """The decode server's max_model_len and KV pool (its /v1/models), read once; {} while it
        does not answer (its own check at /kv/decode still refuses what cannot fit)."""
        if url not in pools:
            try:
                async with state["session"].get(f"{url}/v1/models") as resp:
                    card = await resp.json()
                pool = card["kv_pool"]
                values = (card["data"][0]["max_model_len"], pool["block_size"], pool["num_blocks"])
                pools[url] = dict(zip(DECODE_LIMITS, map(int, values), strict=True))
            except (aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError):
                return {}
        return pools[url]

    async def generate(request: Request, kind: str):
        raw = await request.body()
        i = next(count)
        p, d = prefill[i % len(prefill)], decode[i % len(decode)]
        request_id = f"cmpl-{tag}-{i}"
        session = state["session"]
        # a request the decode server could never run is the prefill server's 400, before any prefill
        params = {"request_id": request_id, **(await decode_limits(d))}
        try:
            async with session.post(f"{p}/kv/prefill/{kind}", params=params, data=raw) as resp:
                if resp.status != 200:  # the body's fault: the prefill server's 4xx as it is
                    return Response(await resp.read(), status_code=resp.status, media_type="application/json")
                first = await resp.json()
        except asyncio.CancelledError:
            abort(request_id, (p,))
            raise
        except aiohttp.ClientError as err:
            abort(request_id, (p,))
            return fail(f"prefill server {p} failed ({type(err).__name__})", 502)
        routed.labels(p, d).inc()
        job = Job(kind, first["model"], (), SamplingParams(), None, first["stream"], first["include_usage"])  # type: ignore[arg-type]
        flow = _Flow(request_id, kind, p, d, first, session, abort)
        if not first["stream"]:
            text = [first["text"]]
            try:
                async for line in flow.rest():
                    text.append(line["text"])
            except (RuntimeError, aiohttp.ClientError, ValueError) as err:
                return fail(str(err), 502)
            if flow.transfer_s is not None:
                transfers.observe(flow.transfer_s)
            answer = full_response(job, request_id, "".join(text), flow.finish_reason or "abort", flow.num_output)
            answer["usage"]["prompt_tokens"] = first["num_prompt_tokens"]
            answer["usage"]["total_tokens"] = first["num_prompt_tokens"] + flow.num_output
            return {**answer, "kv_transfer_s": flow.transfer_s}

        async def cleanup():  # also when the client left before the stream started
            flow.close()

        return StreamingResponse(_events(job, flow), media_type="text/event-stream", background=BackgroundTask(cleanup))

    async def _events(job: Job, flow: _Flow):
        try:
            if job.kind == "chat":
                yield _sse(chunk(job, flow.request_id, None, None, role=True))
            first = flow.first
            ends = first["finish_reason"] is not None
            yield _sse(_with(chunk(job, flow.request_id, first["text"], first["finish_reason"]), ends, None))
            try:
                async for line in flow.rest():  # the finishing line carries the measured transfer
                    ends = line["finish_reason"] is not None
                    out = chunk(job, flow.request_id, line["text"], line["finish_reason"])
                    yield _sse(_with(out, ends, flow.transfer_s))
            except (RuntimeError, aiohttp.ClientError, ValueError) as err:
                yield _sse(error_body(str(err), 502))
                return
            if flow.transfer_s is not None:
                transfers.observe(flow.transfer_s)
            if job.include_usage:
                usage = usage_chunk(job, flow.request_id, first["num_prompt_tokens"], flow.num_output)
                yield _sse({**usage, "kv_transfer_s": flow.transfer_s})
            yield b"data: [DONE]\n\n"
        finally:
            flow.close()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    return app


class _Flow:
    """One request after its token 1: the decode server's lines, and the cleanup of an early end."""

    def __init__(self, request_id: str, kind: str, prefill: str, decode: str, first: dict, session, abort):
        self.request_id, self.kind, self.prefill, self.decode, self.first = request_id, kind, prefill, decode, first
        self.session, self._abort = session, abort
        self.finish_reason: str | None = first["finish_reason"]
        self.num_output = 1 if first["finish_reason"] != "abort" else 0
        self.transfer_s: float | None = None

    async def rest(self):
        """The decode server's lines (none when the request ended at the prefill server)."""
        if self.finish_reason is not None:
            return
        body = {
            "handoff": self.first["handoff"],
            "source": self.prefill,
            "kind": self.kind,
            "first_text": self.first["text"],
        }
        async with self.session.post(f"{self.decode}/kv/decode", json=body) as resp:
            if resp.status != 200:
                self.finish_reason = "abort"
                self._abort(self.request_id, (self.prefill,))
                raise RuntimeError(f"decode server {self.decode}: {(await resp.read())[:200]!r}")
            async for raw in resp.content:
                line = json.loads(raw)
                self.num_output = line["num_output_tokens"]
                if line["finish_reason"] is not None:
                    self.finish_reason, self.transfer_s = line["finish_reason"], line.get("kv_transfer_s")
                yield line

    def close(self) -> None:
        """The client's stream ended; if the request had not, cancel it on both servers."""
        if self.finish_reason is None:
            self.finish_reason = "abort"
            self._abort(self.request_id, (self.decode, self.prefill))


def _with(obj: dict, last: bool, transfer_s: float | None) -> dict:
    """``obj`` with the extra ``kv_transfer_s`` field when it is the request's finishing chunk."""
    return {**obj, "kv_transfer_s": transfer_s} if last else obj


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.serve.router", description=__doc__.splitlines()[0])
    p.add_argument(
        "--prefill", default="", help="the prefill servers: URL[,URL] (python -m engine.serve --role prefill)"
    )
    p.add_argument("--decode", default="", help="the decode servers: URL[,URL] (python -m engine.serve --role decode)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer <key> on /v1 routes")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from engine.serve.app import bind, serve
    from engine.serve.http_base import check_api_key

    args = parse_args(argv)
    try:
        prefill, decode = parse_urls("prefill", args.prefill), parse_urls("decode", args.decode)
        check_api_key(args.api_key)
        sock = bind(args.host, args.port)
    except (ValueError, OSError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    app = build_router(prefill, decode, args.api_key)
    host, port = sock.getsockname()[:2]
    print(f"routing on http://{host}:{port}/v1 ({len(prefill)} prefill, {len(decode)} decode)", flush=True)
    serve(app, sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
