"""Break-it pass over ``python -m engine.serve`` with admission and a tenant header, on the tiny
random model over loopback: 320 seeded malformed requests (tenant header values malformed, huge,
unicode, one tenant each for thousands of tenants; bodies of broken JSON or wrong types) sent as
raw HTTP, each answered 200, 400, 404 (a ``model`` not served), 413 or 429 with a JSON error body,
the server up after all of them and no traceback in its log."""

import asyncio
import json
import logging
import random

from tests.engine.test_serve import Served, post
from tests.engine.test_serve_admission import ADMISSION
from tests.engine.tiny import tiny_engine

HEADER = "x-tenant"
TENANT_VALUES = [
    b"", b" ", b"a" * 8000, "é😀中".encode(), b"\xff\xfe\x80", b"\x01\x7f", b'"quoted"', b"a,b", b"\t", b"..",
    b"../../etc/passwd", b"%00", b"0", b"-1", b"null", b"{}", b"x" * 200,
]  # fmt: skip
FIELDS = ["prompt", "max_tokens", "temperature", "top_p", "seed", "n", "stream", "min_tokens", "user", "model"]
VALUES = [
    None, True, -1, 0, 1, 2**64, 1e308, "", "x", "😀" * 50, [], {}, [5, 6, 7], [-1], [600], [[5]], [[5], [6]],
    ["text"], {"a": 1}, "tiny-random-llama", "x" * 5000,
]  # fmt: skip


def _body(rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:  # broken JSON or not JSON at all
        return rng.choice(
            [b"", b"{", b"[1, 2]", b"null", b'{"prompt": [5,', b"\xff\xfe", rng.randbytes(40), b"{" * 5000]
        )
    if kind == 1:  # deep nesting
        return b'{"prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    body = {f: rng.choice(VALUES) for f in rng.sample(FIELDS, rng.randint(1, 5))}
    if kind == 2:
        body.update(prompt=[5, 6, 7], max_tokens=2)  # valid but for the junk fields kept below
        body.pop(rng.choice(["prompt", "max_tokens"]), None) if rng.random() < 0.2 else None
    return json.dumps(body).encode()


async def _send(port: int, head: bytes, body: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    return int(status_line.split()[1]) if status_line.startswith(b"HTTP/1.1 ") else -1, rest.partition(b"\r\n\r\n")[2]


class _Tracebacks(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record):
        if record.exc_info or "Traceback" in record.getMessage():
            self.records.append(self.format(record))


def test_320_malformed_requests_get_200_400_404_413_or_429_with_json_and_the_server_stays_up():
    rng = random.Random(21)
    logged = _Tracebacks()
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error", "engine")]
    for logger in loggers:
        logger.addHandler(logged)
    server = Served(tiny_engine(**ADMISSION), tenant_header=HEADER)
    port = int(server.url.rsplit(":", 1)[1])
    cases = []
    for i in range(320):
        path = rng.choice([b"/v1/completions", b"/v1/chat/completions"])
        head = b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        if i < 120:  # a new tenant each: thousands of distinct tenants over many runs of the limits
            head += HEADER.encode() + b": " + rng.choice(TENANT_VALUES + [f"t{i}-{rng.random()}".encode()]) + b"\r\n"
        elif i < 160:
            head += b"Authorization: Bearer " + rng.choice(TENANT_VALUES) + b"\r\n"
        body = _body(rng) if i % 3 else json.dumps({"prompt": [5, 6, 7], "max_tokens": 2, "user": f"u{i}"}).encode()
        cases.append((head, body))

    async def run():
        limit = asyncio.Semaphore(32)

        async def one(head, body):
            async with limit:
                return await _send(port, head, body)

        return await asyncio.gather(*(one(h, b) for h, b in cases))

    try:
        answers = asyncio.run(asyncio.wait_for(run(), 120))
        bad = []
        for (head, body), (status, payload) in zip(cases, answers):
            ok = status in (200, 400, 404, 413, 429)
            if ok and status != 200:
                try:
                    ok = "message" in json.loads(payload)["error"]
                except (ValueError, KeyError, TypeError):
                    ok = False
            if not ok:
                bad.append(f"{status} {payload[:200]!r} for {head[-120:]!r} {body[:120]!r}")
        assert not bad, "\n".join(bad[:10])
        assert {s for s, _ in answers} >= {200, 400}, sorted({s for s, _ in answers})
        assert server.thread.is_alive() and server.server.started
        assert post(f"{server.url}/v1/completions", {"prompt": [5], "max_tokens": 2})[0] == 200
        assert server.engine.scheduler.admission.num_reserved_blocks == 0
        assert not logged.records, logged.records[:3]
    finally:
        server.close()
        for logger in loggers:
            logger.removeHandler(logged)


def test_json_nested_3000_deep_is_a_400_not_a_recursion_error():
    """Found by the generator: json.loads raised RecursionError, a 500 with a traceback in the log."""
    server = Served(tiny_engine(**ADMISSION), tenant_header=HEADER)
    try:
        status, raw = post(f"{server.url}/v1/completions", b'{"prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}")
        assert status == 400 and json.loads(raw)["error"]["message"] == "malformed JSON body (nested too deeply)"
    finally:
        server.close()
