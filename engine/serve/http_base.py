"""What every engine.serve app shares: the FastAPI app with its API-key check on ``/v1`` and
``/health``, the OpenAI error response, and the ``/v1/models`` card. fastapi is imported when an
app is built (the engine's base install has no server)."""

from __future__ import annotations

from typing import Any

from engine.serve.api import error_body


def fail(message: str, status: int):
    """An OpenAI-style error response (``error_body``) with HTTP ``status``."""
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(message, status), status_code=status)


def check_api_key(api_key: str | None) -> None:
    """Refuse an empty ``--api-key`` (``--api-key "$KEY"`` with KEY unset): it would ask every
    ``/v1`` client for ``Authorization: Bearer `` and answer all of them 401.

    Raises:
        ValueError: one line naming the flag and the fix.
    """
    if api_key is not None and not api_key.strip():
        raise ValueError(
            f"api_key: is empty (got {api_key!r}), so every /v1 client would get 401; give the key,"
            " or leave --api-key out to serve without one"
        )


def base_app(title: str, lifespan: Any, api_key: str | None):
    """A FastAPI app titled ``title`` with ``lifespan``, no docs routes, ``GET /health`` (200), and
    every ``/v1`` request refused with 401 unless it carries ``Authorization: Bearer <api_key>``
    (when ``api_key`` is set)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    app = FastAPI(title=title, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if api_key is not None and request.url.path.startswith("/v1"):
            if request.headers.get("authorization", "") != f"Bearer {api_key}":
                return fail("invalid or missing API key (Authorization: Bearer <key>)", 401)
        return await call_next(request)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    return app


def model_card(name: str, created: int, max_model_len: int) -> dict[str, Any]:
    """One entry of ``/v1/models``'s ``data`` as vLLM's OpenAI server lists a model."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "kvplan-engine",
        "max_model_len": max_model_len,
    }
