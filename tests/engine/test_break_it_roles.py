"""Bad requests to the disaggregated role servers' own endpoints (``--role prefill|decode``, what
engine.serve.router sends): each answered 400 with an OpenAI-style JSON error body, never a 500 or
FastAPI's bare 422."""

import json

import pytest

from engine.config import EngineConfig
from engine.disagg.workers import worker_engine
from engine.serve.role_app import build_role_app
from tests.engine.test_serve import post
from tests.engine.test_serve_disagg import SETTINGS, Up


@pytest.fixture(scope="module")
def roles():
    ups = [Up(build_role_app(worker_engine(EngineConfig(**SETTINGS), role), role)) for role in ("prefill", "decode")]
    yield ups
    for up in ups:
        up.close()


@pytest.mark.parametrize(
    ("role", "path", "raw", "message"),
    [
        # json's decoder recursed past Python's limit: a RecursionError, 'Internal Server Error' (500, text)
        (
            "decode",
            "/kv/decode",
            b'{"handoff": ' + b"[" * 3000 + b"]" * 3000 + b"}",
            "handoff: malformed JSON body (nested too deeply)",
        ),
        # no request_id: FastAPI's 422 {"detail": [...]} without an error body
        (
            "prefill",
            "/kv/prefill/completion",
            b'{"prompt": [5], "max_tokens": 2}',
            "request_id: a query parameter the router sets; give one (?request_id=...)",
        ),
        # as before: a list body is named
        (
            "decode",
            "/kv/decode",
            b"[1, 2]",
            "handoff: malformed (TypeError: list indices must be integers or slices, not str)",
        ),
    ],
)
def test_a_bad_role_request_is_a_400_with_a_json_error(roles, role, path, raw, message):
    up = roles[0] if role == "prefill" else roles[1]
    status, body = post(up.url + path, raw)
    assert (status, json.loads(body)) == (400, {"error": {"message": message, "type": "BadRequestError", "code": 400}})
    # the server answers a good request afterwards
    status, body = post(roles[0].url + "/kv/prefill/completion?request_id=ok", {"prompt": [5, 6], "max_tokens": 1})
    assert status == 200 and json.loads(body)["num_prompt_tokens"] == 2
