"""`python -m engine.serve` with admission on, on the tiny random model: a burst above capacity gets
429s with Retry-After and no preemption, rejections counted by reason in /metrics, the tenant
read from a header, the body's user or the API key, 300 fuzzed bodies under load answered only
200, 400 or 429 with the loop alive, and bad admission flags refused in one line."""

import asyncio
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.serve.app import main, tenant_of
from tests.engine.test_serve import Served, events, metric, post
from tests.engine.tiny import random_prompts, tiny_engine

# 64 blocks of 4 tokens; a request of 12 + 20 tokens holds ceil(31 / 4) = 8 blocks: the KV budget
# (no reserve) keeps at most 8 such requests queued or running, the queue bound 2 of them queued
ADMISSION = dict(
    block_size=4,
    num_blocks=64,
    enable_prefix_caching=False,
    max_num_seqs=4,
    kv_admission_reserve=0.0,
    max_num_waiting=2,
    max_output_tokens=20,
    tenant_max_concurrency=2,
)


def rejected(url: str) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("kvplan_engine_requests_rejected_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


async def _burst(url: str, prompts, tenants) -> list[tuple[int, str | None, bytes]]:
    import aiohttp

    async def one(session, prompt, tenant):
        body = {"prompt": prompt, "max_tokens": 20, "ignore_eos": True, "stream": True, "user": tenant}
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            return resp.status, resp.headers.get("Retry-After"), await resp.read()

    async with aiohttp.ClientSession() as session:
        return await asyncio.gather(*(one(session, p, t) for p, t in zip(prompts, tenants)))


def test_a_burst_above_capacity_gets_429s_with_retry_after_and_no_preemption():
    server = Served(tiny_engine(**ADMISSION))
    try:
        assert rejected(server.url) == {"queue_full": 0.0, "tenant_waiting": 0.0, "kv_budget": 0.0}
        answers = asyncio.run(_burst(server.url, random_prompts([12] * 16, seed=5), ["a", "b"] * 8))
        refused = [(retry, json.loads(raw)["error"]) for status, retry, raw in answers if status == 429]
        served = [events(raw) for status, _, raw in answers if status == 200]
        assert len(refused) + len(served) == 16 and refused and served
        assert all(retry == "1" and err["type"] == "RateLimitError" for retry, err in refused)
        reasons = [err["message"].split(":", 1)[0] for _, err in refused]
        counts = rejected(server.url)
        assert {r: reasons.count(r) for r in counts} == counts  # /metrics counts exactly the 429s, by reason
        assert all(e[-2]["choices"][0]["finish_reason"] == "length" for e in served)  # [DONE] last
        assert metric(server.url, "vllm:num_preemptions_total") == 0
        assert server.engine.scheduler.admission.num_reserved_blocks == 0  # nothing left reserved
    finally:
        server.close()


def test_the_tenant_comes_from_the_header_then_user_then_the_api_key():
    headers = {"x-team": "red", "authorization": "Bearer k3y"}
    assert tenant_of(headers, "alice", "x-team") == "red"
    assert tenant_of(headers, "alice", None) == "alice"
    assert tenant_of(headers, None, "x-missing") == "k3y"
    assert tenant_of({}, None, None) is None


def test_the_output_cap_clamps_a_larger_max_tokens():
    server = Served(tiny_engine(**ADMISSION))
    try:
        # 10,000 tokens would be over max_model_len (a 400 without the cap); clamped to 20
        status, raw = post(
            f"{server.url}/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 10_000, "ignore_eos": True}
        )
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 20
    finally:
        server.close()


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-2, 600), max_size=300),
)
_BODIES = st.one_of(
    st.dictionaries(
        st.sampled_from(
            ["prompt", "max_tokens", "temperature", "top_p", "seed", "n", "stream", "min_tokens", "user", "cache_salt"]
        ),
        _VALUES,
        max_size=6,
    ).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=40),
)


@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(_BODIES, min_size=300, max_size=300))
def test_300_fuzzed_bodies_under_load_get_only_200_400_or_429(bodies):
    import aiohttp

    server = Served(tiny_engine(**ADMISSION))

    async def send(session, body, limit):
        async with limit, session.post(f"{server.url}/v1/completions", data=body) as resp:
            await resp.read()
            return resp.status

    async def run():
        limit = asyncio.Semaphore(32)
        async with aiohttp.ClientSession() as session:
            load = asyncio.create_task(_burst(server.url, random_prompts([12] * 8, seed=9), ["a"] * 8))
            statuses = await asyncio.gather(*(send(session, b, limit) for b in bodies))
            return statuses, await load

    try:
        statuses, loaded = asyncio.run(run())
        assert set(statuses) <= {200, 400, 429}, sorted(set(statuses))
        assert {status for status, _, _ in loaded} <= {200, 429}
        assert server.engine.scheduler.admission.num_reserved_blocks == 0
        assert (
            server.server.started and post(f"{server.url}/v1/completions", {"prompt": [5], "max_tokens": 2})[0] == 200
        )
    finally:
        server.close()


def test_bad_admission_flags_exit_2_in_one_line(capsys):
    for flags, start in (
        (["--kv-admission-reserve", "-0.1"], "error: kv_admission_reserve: must be a fraction in [0, 1) (got -0.1)"),
        (["--tenant-max-concurrency", "0"], "error: tenant_max_concurrency: must be >= 1"),
        (["--tenant-header", " "], "error: tenant_header: names no header"),
    ):
        assert main(["--model", "tiny-random-llama", "--port", "0", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(start), err
