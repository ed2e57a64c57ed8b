"""`python -m engine.serve` on the tiny random model: the same tokens as the engine itself, vLLM's
metric names, a disconnect that frees blocks, the API key, and a few hundred bad bodies answered
with 400s while good streams keep going."""

import asyncio
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from engine.request import SamplingParams
from engine.serve.app import bind, build_app, main
from tests.engine.tiny import random_prompts, tiny_engine

POOL = dict(block_size=4, num_blocks=64, enable_prefix_caching=False, max_num_seqs=8)


class Served:
    """An app on a free port in a thread (uvicorn), stopped by ``close``."""

    def __init__(self, engine, **kwargs):
        import uvicorn

        self.engine = engine
        sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(build_app(engine, **kwargs), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def served():
    server = Served(tiny_engine(**POOL))
    yield server
    server.close()


def post(url: str, body, key: str | None = None) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def events(raw: bytes) -> list:
    return [
        json.loads(line[6:]) if line != b"data: [DONE]" else "[DONE]"
        for line in raw.split(b"\n\n")
        if line.startswith(b"data: ")
    ]


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_a_stream_carries_the_engines_own_greedy_tokens_and_usage(served):
    prompt = random_prompts([10])[0]
    generated = metric(served.url, "vllm:generation_tokens_total")
    status, raw = post(
        f"{served.url}/v1/completions",
        {
            "prompt": prompt,
            "max_tokens": 9,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert status == 200
    chunks = events(raw)
    assert chunks[-1] == "[DONE]" and chunks[-2]["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 9,
        "total_tokens": 19,
    }
    text = "".join(c["choices"][0]["text"] for c in chunks[:-2])
    assert chunks[-3]["choices"][0]["finish_reason"] == "length"
    # every generated token counts, the first (sampled by the prefill step) included, as in vLLM v1
    assert metric(served.url, "vllm:generation_tokens_total") - generated == 9
    reference = tiny_engine(**POOL).generate([prompt], SamplingParams(max_tokens=9, ignore_eos=True))[0]
    assert text == "".join(f"<{t}>" for t in reference.output_token_ids)  # tokens as <id> without a tokenizer


def test_models_health_and_vllm_metric_names(served):
    models = json.loads(urllib.request.urlopen(f"{served.url}/v1/models").read())
    assert models["data"][0]["id"] == "tiny-random-llama" and models["data"][0]["owned_by"] == "kvplan-engine"
    assert urllib.request.urlopen(f"{served.url}/health").status == 200
    text = urllib.request.urlopen(f"{served.url}/metrics").read().decode()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ):
        assert f"\n{name}{{" in text
    assert (
        'vllm:cache_config_info{block_size="4",cache_dtype="auto",enable_prefix_caching="False",'
        'num_gpu_blocks="64"} 1.0' in text
    )


def test_a_client_that_disconnects_aborts_its_request_and_frees_its_blocks(served):
    host, port = served.url.removeprefix("http://").split(":")
    body = json.dumps(
        {"prompt": random_prompts([40])[0], "max_tokens": 200, "ignore_eos": True, "stream": True}
    ).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    got = b""
    while got.count(b"data: ") < 3:  # a few tokens in: the request holds blocks now
        got += sock.recv(4096)
    assert served.engine.scheduler.num_used_blocks > 0
    sock.close()
    deadline = time.time() + 20
    while time.time() < deadline and (served.engine.scheduler.num_used_blocks or served.engine.has_unfinished()):
        time.sleep(0.05)
    assert served.engine.scheduler.num_used_blocks == 0 and not served.engine.has_unfinished()
    assert metric(served.url, "vllm:num_requests_running") == 0.0


def test_the_api_key_is_required_on_v1_routes():
    server = Served(tiny_engine(**POOL), api_key="k3y")
    try:
        assert post(f"{server.url}/v1/completions", {"prompt": [5, 6], "max_tokens": 2})[0] == 401
        assert post(f"{server.url}/v1/completions", {"prompt": [5, 6], "max_tokens": 2}, key="nope")[0] == 401
        assert post(f"{server.url}/v1/completions", {"prompt": [5, 6], "max_tokens": 2}, key="k3y")[0] == 200
        assert urllib.request.urlopen(f"{server.url}/health").status == 200  # not a /v1 route
    finally:
        server.close()


def bad_bodies(n: int, seed: int = 0) -> list[tuple[str, bytes]]:
    """``n`` bodies that must each be refused with a 400: malformed JSON, wrong types, values out of
    range, token ids outside the vocabulary, prompts over max_model_len, chat on a model without a
    template."""
    rng = random.Random(seed)
    good = {"prompt": [5, 6, 7], "max_tokens": 4}
    wrong = {
        "prompt": [5, {}, [], "", [1.5], [600], [-1], [[1], [2]], list(range(3, 300))],
        "max_tokens": [0, -1, "5", 1.5, True, [4], 10_000],
        "temperature": [-1, "hot", [0]],
        "top_p": [0, 2, "x"],
        "seed": [-1, "x", 2**64, 1.5],
        "n": [2, 0, "1"],
        "stream": ["yes", 1],
        "ignore_eos": ["true", 1],
        "min_tokens": [-1, 5, "1"],
        "cache_salt": [5, "", []],
        "stop": [["\n"], "x"],
        "model": [5, ["m"]],
    }
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.2:
            text = json.dumps(good)
            out.append(("/v1/completions", text[: rng.randrange(1, len(text) - 1)].encode()))
        elif kind < 0.25:
            out.append(("/v1/completions", rng.choice([b"[]", b"5", b'"x"', b"null", b"\xff\xfe"])))
        elif kind < 0.3:
            out.append(
                (
                    "/v1/chat/completions",
                    json.dumps(
                        rng.choice(
                            [
                                {"messages": []},
                                {"messages": "hi"},
                                {"messages": [{"role": 5}]},
                                {"messages": [{"role": "user", "content": "hi"}]},
                            ]
                        )
                    ).encode(),
                )
            )
        else:
            body = dict(good)
            field = rng.choice(sorted(wrong))
            body[field] = rng.choice(wrong[field])
            out.append(("/v1/completions", json.dumps(body).encode()))
    return out


def test_bad_bodies_get_400s_while_good_streams_all_complete(served):
    import aiohttp

    prompts = random_prompts([12] * 6, seed=3)

    async def good(session, prompt):
        body = {
            "prompt": prompt,
            "max_tokens": 40,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with session.post(f"{served.url}/v1/completions", json=body) as resp:
            raw = await resp.read()
        return events(raw)[-2]["usage"]["completion_tokens"]

    async def bad(session, path, body, limit):
        async with (
            limit,
            session.post(f"{served.url}{path}", data=body, headers={"Content-Type": "application/json"}) as resp,
        ):
            return resp.status, (await resp.json())["error"]["message"]

    async def run():
        limit = asyncio.Semaphore(16)
        async with aiohttp.ClientSession() as session:
            goods = [asyncio.create_task(good(session, p)) for p in prompts]
            answers = await asyncio.gather(*(bad(session, path, body, limit) for path, body in bad_bodies(300)))
            return answers, await asyncio.gather(*goods)

    answers, completed = asyncio.run(run())
    assert len(answers) == 300 and all(status == 400 and message for status, message in answers), answers[:5]
    assert completed == [40] * 6


def test_bad_settings_exit_2_in_one_line(capsys):
    assert main(["--model", "tiny-random-llama", "--block-size", "0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: block_size: must be >= 1")
