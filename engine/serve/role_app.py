"""The prefill and decode servers: ``python -m engine.serve --role prefill|decode`` (engine.serve.app
parses the flags and starts them; the engine flags mean what they mean for the aggregated server).

Routes besides ``GET /health``, ``GET /v1/models`` and ``GET /metrics`` (engine.serve.disagg_metrics)
are the router's (engine.serve.router), under ``/kv``, JSON unless said::

    prefill  POST /kv/prefill/{completion|chat}?request_id=ID   body: the client's OpenAI body
               -> {"text", "finish_reason", "num_prompt_tokens", "handoff", "model", "stream",
                   "include_usage"} once token 1 is sampled; a bad body is the aggregated server's 4xx
             GET  /kv/blocks/ID    the held blocks' K/V (application/octet-stream, engine.disagg.kv_blocks
                                   layout; 404: not held)
             POST /kv/release/ID   free them (the transfer ended)
             POST /kv/abort/ID     cancel in prefill or while held
    decode   POST /kv/decode       {"handoff", "source": the prefill server's URL, "kind", "model",
                                   "first_text"} -> newline-delimited JSON, one line per update from
                                   token 2 on: {"text", "num_output_tokens", "finish_reason"}, the last
                                   with "kv_transfer_s" (seconds, this handoff's measured transfer)
             POST /kv/abort/ID     cancel wherever the request is here (the source is told to free)

A decode server fetches each admitted handoff's blocks from ``source`` over HTTP (GET /kv/blocks,
then POST /kv/release). The ``/kv`` routes are internal and unauthenticated (``--api-key`` guards
``/v1`` only): bind the role servers to an address only the router reaches (127.0.0.1, the default).
"""

import asyncio
import contextlib
import json
import time
import urllib.request
from dataclasses import replace

from engine.disagg.workers import DecodeWorker, PrefillWorker
from engine.serve.api import DECODE_LIMITS, BadRequest, Job, Limits, check_fit, parse_body
from engine.serve.disagg_metrics import DisaggMetrics
from engine.serve.http_base import base_app, fail, model_card
from engine.serve.role_loops import DecodeLoop, PrefillLoop, PrefillResult, handoff_from, handoff_json

TRANSFER_TIMEOUT_S = 60.0


def fetch_blocks(source: str, request_id: str) -> bytes:
    """The held blocks of ``request_id`` from the prefill server at ``source`` (raises OSError)."""
    with urllib.request.urlopen(f"{source}/kv/blocks/{request_id}", timeout=TRANSFER_TIMEOUT_S) as r:
        return r.read()


def release_blocks(source: str, request_id: str) -> None:
    """Tell the prefill server at ``source`` to free ``request_id``'s held blocks (raises OSError)."""
    req = urllib.request.Request(f"{source}/kv/release/{request_id}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=TRANSFER_TIMEOUT_S) as r:
        r.read()


def build_role_app(engine, role: str, served_model_name: str | None = None, api_key: str | None = None):
    """The FastAPI app of a ``role`` (prefill | decode) server around ``engine`` (made by
    engine.disagg.workers.worker_engine for that role); ``app.state.loop`` is its PrefillLoop or
    DecodeLoop, ``app.state.worker`` its worker. Raises ValueError: an engine not made for ``role``."""
    from fastapi import Request
    from fastapi.responses import Response, StreamingResponse

    name = served_model_name or engine.model_name
    metrics = DisaggMetrics(
        name,
        role,
        block_size=engine.block_size,
        num_gpu_blocks=engine.num_blocks,
        cache_dtype=engine.config.kv_cache_dtype,
        enable_prefix_caching=engine.config.enable_prefix_caching,
    )
    loop: PrefillLoop | DecodeLoop
    if role == "prefill":
        loop = PrefillLoop(PrefillWorker(engine), metrics)
    else:
        loop = DecodeLoop(DecodeWorker(engine), fetch_blocks, release_blocks, metrics)
    worker = loop.worker
    limits = Limits(
        name,
        engine.hf_config.vocab_size,
        engine.max_model_len,
        engine.block_size,
        engine.num_blocks,
        engine.config.max_output_tokens,
    )
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loop.start()
        yield
        loop.stop()

    app = base_app(f"engine.serve ({role})", lifespan, api_key)
    app.state.loop, app.state.metrics, app.state.worker = loop, metrics, worker

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        pool = {"block_size": engine.block_size, "num_blocks": engine.num_blocks}  # a router checks fit by it
        card = model_card(name, created, engine.max_model_len)
        return {"object": "list", "data": [card], "role": role, "kv_pool": pool}

    @app.post("/kv/abort/{request_id}")
    async def abort(request_id: str):
        loop.abort(request_id)
        return Response(status_code=200)

    if isinstance(loop, PrefillLoop):
        prefill_loop = loop

        @app.post("/kv/prefill/{kind}")
        async def prefill(kind: str, request: Request, request_id: str = ""):
            if kind not in ("completion", "chat"):
                return fail(f"kind: must be completion or chat (got {kind!r})", 404)
            if not request_id:  # the router names each request; FastAPI's own 422 has no error body
                return fail("request_id: a query parameter the router sets; give one (?request_id=...)", 400)
            try:
                job = parse_body(await request.body(), kind, limits, engine.tokenizer)  # type: ignore[arg-type]
                decode_limits = _decode_limits(request.query_params, limits)
                if decode_limits is not None:  # the router's decode server: a request it can never run is a 400 now
                    check_fit(len(job.prompt_token_ids), job.params.max_tokens, decode_limits, "the decode server: ")
            except BadRequest as err:
                return fail(err.message, err.status)
            answer: asyncio.Future = asyncio.get_running_loop().create_future()
            prefill_loop.submit_as(request_id, job, answer.set_result)
            result: PrefillResult = await answer
            return {
                "text": result.text,
                "finish_reason": result.finish_reason,
                "num_prompt_tokens": result.num_prompt_tokens,
                "handoff": handoff_json(result.handoff) if result.handoff is not None else None,
                "model": name,
                "stream": job.stream,
                "include_usage": job.include_usage,
            }

        @app.get("/kv/blocks/{request_id}")
        async def blocks(request_id: str):
            got: asyncio.Future = asyncio.get_running_loop().create_future()
            prefill_loop.export(request_id, got.set_result)
            payload = await got
            if payload is None:
                return fail(f"{request_id}: no blocks held for it here", 404)
            return Response(payload, media_type="application/octet-stream")

        @app.post("/kv/release/{request_id}")
        async def release(request_id: str):
            prefill_loop.release(request_id)
            return Response(status_code=200)

    else:
        decode_loop = loop

        @app.post("/kv/decode")
        async def decode(request: Request):
            try:
                data = json.loads(await request.body())
                handoff = handoff_from(data["handoff"])
                source, kind, first_text = (
                    str(data["source"]),
                    data.get("kind", "completion"),
                    str(data.get("first_text", "")),
                )
            except (ValueError, TypeError, KeyError) as err:
                return fail(f"handoff: malformed ({type(err).__name__}: {err})", 400)
            except RecursionError:  # json's decoder recurses once per nesting level, as parse_body says
                return fail("handoff: malformed JSON body (nested too deeply)", 400)
            if handoff.block_size != engine.block_size:
                return fail(
                    f"handoff: block_size {handoff.block_size} differs from this server's {engine.block_size}", 400
                )
            n = len(handoff.prompt_token_ids) + handoff.params.max_tokens
            if n > engine.max_model_len or -(-(n - 1) // engine.block_size) > engine.num_blocks:
                return fail(f"handoff: {n} tokens do not fit this decode server (max_model_len, KV pool)", 400)
            job = Job(kind, name, handoff.prompt_token_ids, handoff.params, handoff.cache_salt, True, False)
            updates: asyncio.Queue = asyncio.Queue()
            decode_loop.offer(handoff, source, job, updates.put_nowait, first_text)
            return StreamingResponse(_lines(handoff.request_id, updates), media_type="application/x-ndjson")

        async def _lines(request_id: str, updates: asyncio.Queue):
            finished = False
            try:
                while not finished:
                    update = await updates.get()
                    finished = update.finish_reason is not None
                    line = {
                        "text": update.text,
                        "num_output_tokens": update.num_output_tokens,
                        "finish_reason": update.finish_reason,
                    }
                    if finished:
                        line["kv_transfer_s"] = decode_loop.transfer_s.pop(request_id, None)
                    yield json.dumps(line).encode() + b"\n"
            finally:
                if not finished:  # the router went away: free the blocks here and at the source
                    decode_loop.abort(request_id)

    return app


def _decode_limits(query, limits: Limits) -> Limits | None:
    """The decode server's limits a router passes with a prefill (``DECODE_LIMITS`` query
    parameters, all or none), as Limits; None when not given.

    Raises:
        BadRequest: some given and not others, or one not a positive integer.
    """
    given = [query.get(key) for key in DECODE_LIMITS]
    if all(v is None for v in given):
        return None
    try:
        values = [int(v) for v in given if v is not None]
    except ValueError:
        raise BadRequest(f"{', '.join(DECODE_LIMITS)}: give all three, positive integers") from None
    if len(values) < len(given) or min(values) < 1:
        raise BadRequest(f"{', '.join(DECODE_LIMITS)}: give all three, positive integers")
    max_model_len, block_size, num_blocks = values
    return replace(limits, max_model_len=max_model_len, block_size=block_size, num_blocks=num_blocks)
