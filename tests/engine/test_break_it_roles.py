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


TINY_FLAGS = ["--model", "tiny-random-llama", "--dtype", "float32", "--device", "cpu"]
ROUTER_FLAGS = ["--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"]


@pytest.mark.parametrize(
    ("which", "argv", "line"),
    [
        # socket's OverflowError: a traceback
        ("serve", ["--port", "99999"], "error: port: must be in [0, 65535] (got 99999); 0 takes a free one"),
        ("router", ["--port", "-1"], "error: port: must be in [0, 65535] (got -1); 0 takes a free one"),
        # once 'error: [Errno -2] Name or service not known', naming no flag
        (
            "serve",
            ["--port", "0", "--host", "999.1.1.1"],
            "error: host, port: cannot listen on 999.1.1.1:0 (Name or service not known)",
        ),
        # --api-key "$KEY" with KEY unset: once served, answering every /v1 client 401
        *[
            (
                which,
                ["--port", "0", "--api-key", "", *more],
                "error: api_key: is empty (got ''), so every /v1 client would get 401; give the key, or leave"
                " --api-key out to serve without one",
            )
            for which, more in (("serve", []), ("serve", ["--role", "decode"]), ("router", []))
        ],
    ],
)
def test_bad_listen_flags_are_one_line_and_exit_2(which, argv, line, capsys):
    from engine.serve import app, router

    code = app.main(TINY_FLAGS + argv) if which == "serve" else router.main(ROUTER_FLAGS + argv)
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == line, err
