"""The server of ``python -m engine.serve``: flags, the FastAPI app and its routes, start-up.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (server-sent events with
``stream: true``, a usage chunk with ``stream_options.include_usage``; one JSON answer without),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text, vLLM's metric names:
engine.serve.metrics). Flags are vLLM's names (``--model``, ``--dtype``, ``--block-size``,
``--num-gpu-blocks-override``, ``--max-num-seqs``, ``--max-num-batched-tokens``,
``--max-model-len``, ``--kv-cache-dtype``, ``--enable-prefix-caching``, ``--host``, ``--port``,
``--api-key``, ``--served-model-name``); the engine's own: ``--device``, ``--kv-cache-memory-bytes``,
``--attention-backend``, ``--seed``. ``--role prefill|decode`` starts a worker of a
disaggregated deployment instead (engine.serve.role_app; the router is engine.serve.router).

Admission at the entry (engine.admission; off unless given): ``--max-num-waiting`` (queue bound),
``--kv-admission-reserve`` (turns on the KV budget: the pool less this fraction),
``--max-output-tokens`` (max_tokens clamped to it), ``--tenant-max-concurrency`` and
``--tenant-max-waiting`` (per tenant: requests running, and queued). A refused request gets 429
with ``Retry-After: 1`` and a message that starts with its reason (``queue_full``,
``tenant_waiting``, ``kv_budget``), counted in ``kvplan_engine_requests_rejected_total{reason}``.
The tenant is the value of the header ``--tenant-header`` names, else the body's ``user``, else
the bearer token of ``Authorization``; a request with none is under no per-tenant limit.

KV offload tiers (engine.offload; off unless given): ``--kv-offload-host-gib`` (host memory),
``--kv-offload-disk-gib`` and ``--kv-offload-disk-path`` (a disk tier, one file in that directory);
/metrics then adds ``kvplan_engine_offload_*`` (stores, loads, hit tokens by tier, bytes moved).

One engine loop steps for all streams (engine.serve.loop), on the only thread that runs torch on
more than one thread (engine.serve.threads: the main thread loads the model on one). A client
that disconnects mid-stream aborts its request, which frees its blocks before the next step. Bad
bodies are 400s with a message (engine.serve.api), never an exception in the loop. It binds 127.0.0.1 unless ``--host``
says otherwise; with ``--api-key`` every ``/v1`` route needs ``Authorization: Bearer <key>``
(401 otherwise). Once listening it prints ``serving <model> on http://HOST:PORT/v1`` (``--port
0`` picks a free port). Bad settings print one line and exit 2.
"""

import argparse
import asyncio
import json
import socket
import sys
import time

from engine.admission import SETTINGS
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.serve.http_base import base_app, check_api_key, fail, model_card
from engine.serve.threads import torch_threads_for_engine_loop

ROLES = ("aggregated", "prefill", "decode")  # --role (engine.serve.role_app serves the last two)
RETRY_AFTER_S = 1  # Retry-After of a 429: the least whole second HTTP can say (RFC 9110, 10.2.3)


def tenant_of(headers, user: str | None, tenant_header: str | None) -> str | None:
    """A request's tenant: the ``tenant_header`` header's value, else the body's ``user``, else
    the bearer token of ``Authorization``; None when none is given. ``headers``: a mapping with
    case-insensitive ``get``."""
    if tenant_header and (value := headers.get(tenant_header)):
        return value
    if user:
        return user
    token = headers.get("authorization", "").removeprefix("Bearer ").strip()
    return token or None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.serve", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"{DEFAULT_MODEL} (default), tiny-random-llama or a local HF folder"
    )
    p.add_argument("--served-model-name", default=None, help="the name /v1/models lists (default: --model)")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16) | bfloat16 | float16 | float32")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks-override", type=int, default=None, help="KV pool in blocks")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="KV pool in bytes (default 256 MiB)")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto | bfloat16 | float16 | float32 | fp8")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--attention-backend", default="auto", help="auto | torch | triton")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer <key> on /v1 routes")
    p.add_argument(
        "--role",
        default="aggregated",
        help="aggregated (default) | prefill | decode: a worker of a disaggregated deployment (engine.serve.role_app)",
    )
    o = p.add_argument_group("KV offload tiers (engine.offload; off unless given)")
    o.add_argument("--kv-offload-host-gib", type=float, default=None, help="a host-memory tier of this many GiB")
    o.add_argument("--kv-offload-disk-gib", type=float, default=None, help="a disk tier of this many GiB")
    o.add_argument("--kv-offload-disk-path", default=None, help="an existing directory for the disk tier's file")
    a = p.add_argument_group("admission at the entry (off unless given; refused requests get 429)")
    a.add_argument("--max-num-waiting", type=int, default=None, help="the most requests queued")
    a.add_argument(
        "--kv-admission-reserve",
        type=float,
        default=None,
        help="KV budget: queued + running requests' prompt + max_tokens must fit the pool less this fraction, [0, 1)",
    )
    a.add_argument("--max-output-tokens", type=int, default=None, help="clamp max_tokens to this")
    a.add_argument("--tenant-max-concurrency", type=int, default=None, help="the most running requests per tenant")
    a.add_argument("--tenant-max-waiting", type=int, default=None, help="the most queued requests per tenant")
    a.add_argument(
        "--tenant-header", default=None, help="the header naming the tenant (else the body's user, else the API key)"
    )
    return p.parse_args(argv)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the flags describe. Raises engine.config.SettingError."""
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        num_blocks=args.num_gpu_blocks_override,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        attention_backend=args.attention_backend,
        seed=args.seed,
        offload_host_gib=args.kv_offload_host_gib,
        offload_disk_gib=args.kv_offload_disk_gib,
        offload_disk_path=args.kv_offload_disk_path,
        **{name: getattr(args, name) for name in SETTINGS},
    )


def build_app(
    engine, served_model_name: str | None = None, api_key: str | None = None, tenant_header: str | None = None
):
    """The FastAPI app around ``engine`` (an ``LLMEngine``) and its EngineLoop; the loop starts
    and stops with the app (``app.state.loop``). ``tenant_header``: see ``tenant_of``."""
    import contextlib
    from dataclasses import replace

    from fastapi import Request
    from fastapi.responses import Response, StreamingResponse

    from engine.serve.api import (
        BadRequest,
        JobKind,
        Limits,
        chunk,
        full_response,
        parse_body,
        usage_chunk,
    )
    from engine.serve.loop import EngineLoop
    from engine.serve.metrics import ServeMetrics

    name = served_model_name or engine.model_name
    metrics = ServeMetrics(
        name,
        block_size=engine.block_size,
        num_gpu_blocks=engine.num_blocks,
        cache_dtype=engine.config.kv_cache_dtype,
        enable_prefix_caching=engine.config.enable_prefix_caching,
        offload_tiers=tuple(t.name for t in offload.tiers)
        if (offload := engine.scheduler.block_manager.offload)
        else (),
    )
    loop = EngineLoop(engine, metrics)
    admission = engine.scheduler.admission
    limits = Limits(
        name,
        engine.hf_config.vocab_size,
        engine.max_model_len,
        engine.block_size,
        engine.num_blocks,
        engine.config.max_output_tokens,
        admission.budget_blocks if admission is not None else None,
    )
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loop.start()
        yield
        loop.stop()

    app = base_app("engine.serve", lifespan, api_key)
    app.state.loop, app.state.metrics = loop, metrics

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(name, created, engine.max_model_len)]}

    async def generate(request: Request, kind: JobKind):
        try:
            job = parse_body(await request.body(), kind, limits, engine.tokenizer)
        except BadRequest as err:
            return fail(err.message, err.status)
        updates: asyncio.Queue = asyncio.Queue()
        if admission is None:
            request_id = loop.submit(job, updates.put_nowait)
        else:
            job = replace(job, tenant=tenant_of(request.headers, job.user, tenant_header))
            decided: asyncio.Future = asyncio.get_running_loop().create_future()
            request_id = loop.submit(job, updates.put_nowait, decided.set_result)
            try:
                refusal = await decided
            except asyncio.CancelledError:  # the client went away before the decision
                loop.abort(request_id)
                raise
            if refusal is not None:
                response = fail(refusal, 429)
                response.headers["Retry-After"] = str(RETRY_AFTER_S)
                return response
        if not job.stream:
            text, last = [], None
            while last is None or last.finish_reason is None:
                last = await updates.get()
                text.append(last.text)
            return full_response(job, request_id, "".join(text), last.finish_reason, last.num_output_tokens)
        return StreamingResponse(_events(job, request_id, updates), media_type="text/event-stream")

    async def _events(job, request_id: str, updates: asyncio.Queue):
        finished = False
        try:
            if job.kind == "chat":
                yield _sse(chunk(job, request_id, None, None, role=True))
            while not finished:
                update = await updates.get()
                finished = update.finish_reason is not None
                yield _sse(chunk(job, request_id, update.text, update.finish_reason))
            if job.include_usage:
                yield _sse(usage_chunk(job, request_id, update.num_prompt_tokens, update.num_output_tokens))
            yield b"data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away: free its blocks
                loop.abort(request_id)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    return app


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (``port`` 0: a free one).

    Raises:
        ValueError: ``port`` outside [0, 65535] (socket's own OverflowError was a traceback).
        OSError: the address cannot be bound (an unknown host, a port in use), naming ``host:port``.
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"port: must be in [0, 65535] (got {port}); 0 takes a free one")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(f"host, port: cannot listen on {host}:{port} ({err.strerror or err})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(app, sock: socket.socket) -> None:
    """Run ``app`` on ``sock`` with uvicorn until interrupted."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", timeout_keep_alive=30, backlog=2048)
    uvicorn.Server(config).run(sockets=[sock])


def role_main(args: argparse.Namespace) -> int:
    """Start a ``--role prefill|decode`` server (engine.serve.role_app) from the parsed flags; 2 on bad settings."""
    try:
        from engine.disagg.workers import worker_engine

        check_api_key(args.api_key)
        engine = worker_engine(engine_config(args), args.role)
        sock = bind(args.host, args.port)
    except (ValueError, RuntimeError, OSError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    from engine.serve.role_app import build_role_app

    app = build_role_app(engine, args.role, args.served_model_name, args.api_key)
    host, port = sock.getsockname()[:2]
    print(f"serving {args.served_model_name or engine.model_name} ({args.role}) on http://{host}:{port}", flush=True)
    serve(app, sock)
    return 0


def aggregated_main(args: argparse.Namespace) -> int:
    """Start the aggregated server (``build_app``) from the parsed flags; 2 on bad settings."""
    try:
        from engine.llm_engine import LLMEngine

        check_api_key(args.api_key)
        engine = LLMEngine(engine_config(args))
        sock = bind(args.host, args.port)
    except (ValueError, RuntimeError, OSError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    app = build_app(engine, args.served_model_name, args.api_key, args.tenant_header)
    host, port = sock.getsockname()[:2]
    print(f"serving {args.served_model_name or engine.model_name} on http://{host}:{port}/v1", flush=True)
    serve(app, sock)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role not in ROLES:
        print(f"error: role: must be one of {', '.join(ROLES)} (got {args.role!r})", file=sys.stderr)
        return 2
    if args.role != "aggregated":
        for flag in ("tenant_header", "kv_offload_host_gib", "kv_offload_disk_gib", "kv_offload_disk_path"):
            if getattr(args, flag) is not None:
                print(f"error: {flag}: not supported on a {args.role} server; leave it unset", file=sys.stderr)
                return 2
    elif args.tenant_header is not None and not args.tenant_header.strip():
        print("error: tenant_header: names no header (got ''); give a header name, e.g. X-Tenant", file=sys.stderr)
        return 2
    with torch_threads_for_engine_loop():  # the model loads and steps on the loop thread's threads only
        return aggregated_main(args) if args.role == "aggregated" else role_main(args)
