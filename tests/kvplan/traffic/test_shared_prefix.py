"""The shared_prefix workload option: validation, prompts with prefixes, the load test's cached /
uncached variants of each level, hit rates, and the estimate with the prefix counted once."""

import math
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.results.records import RequestRecord, StepRecord
from kvplan.results.run_result import load_run
from kvplan.results.stats.prefix_metrics import PrefixPricing, residents, shared_prefix_estimate_bytes
from kvplan.results.summarize import prefix_pricing
from kvplan.traffic.prompts import read_sharegpt, sample_buckets
from kvplan.workload.file import load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[3]
BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # tiny-random-llama fp32: 2 layers x K,V x 2 heads x 16 x 4 B
BLOCK = 4
PREFIX = 18  # 4 full blocks of 4 (16 tokens) + 2 tokens that share a block with the own prompt


def tiny_workload(shared_prefix=None, **engine):
    return {
        "name": "sp",
        "seed": 3,
        "dataset": "random",
        "engine": {
            "model": "tiny-random-llama",
            "dtype": "float32",
            "block_size": BLOCK,
            "num_blocks": 96,
            "max_num_seqs": 16,
            "max_num_batched_tokens": 256,
            **engine,
        },
        "shared_prefix": shared_prefix
        if shared_prefix is not None
        else {"num_tokens": PREFIX, "num_prefixes": 2, "fraction": 0.75, "num_tenants": 2},
        "buckets": [
            {"name": "short", "input_tokens": [6, 10], "output_tokens": 5, "concurrency": [1, 4], "num_requests": 8}
        ],
    }


# ---- validation ------------------------------------------------------------------------------
BAD = [
    ({"num_tokens": 18, "fraction": 1.5}, {}, "<memory>: shared_prefix.fraction: must be <= 1 (got 1.5)"),
    ({"num_tokens": 18, "fraction": 0}, {}, "<memory>: shared_prefix.fraction: must be > 0.0 (got 0)"),
    ({"num_tokens": 18, "num_prefixes": 0}, {}, "<memory>: shared_prefix.num_prefixes: must be >= 1 (got 0)"),
    ({"num_tokens": "18"}, {}, "<memory>: shared_prefix.num_tokens: must be an integer (got '18')"),
    ({"num_tokens": 18, "tenants": 2}, {}, "<memory>: shared_prefix.tenants: unknown field; check the spelling"),
    ({"fraction": 0.5}, {}, "<memory>: shared_prefix.num_tokens: required field missing"),
    (
        {"num_tokens": 18},
        {"enable_prefix_caching": False},
        "<memory>: engine.enable_prefix_caching: shared_prefix needs prefix caching on (got false); "
        "set engine.enable_prefix_caching: true",
    ),
    (
        {"num_tokens": 3},
        {},
        "<memory>: shared_prefix.num_tokens: must be >= engine.block_size 4: only full blocks are shared (got 3)",
    ),
    (
        {"num_tokens": 190},
        {"max_model_len": 200},
        "<memory>: buckets[0]: shortest request with the shared prefix (190 + 6 + 5 = 201 tokens) exceeds"
        " engine.max_model_len 200",
    ),
]


@pytest.mark.parametrize(("prefix", "engine", "message"), BAD)
def test_a_bad_shared_prefix_is_one_line_naming_the_field(prefix, engine, message):
    with pytest.raises(KvplanError) as caught:
        parse_workload(tiny_workload(prefix, **engine))
    assert str(caught.value).startswith(message)


def test_the_shipped_workload_loads_with_caching_on():
    workload = load_workload(ROOT / "workloads" / "shared_prefix.yaml")
    assert workload.dataset.kind == "sharegpt" and workload.engine.enable_prefix_caching
    assert workload.shared_prefix.num_tokens >= 4 * workload.engine.block_size


# ---- prompts ---------------------------------------------------------------------------------
def test_random_prefixes_go_in_front_of_the_same_own_prompts():
    plain = parse_workload({k: v for k, v in tiny_workload().items() if k != "shared_prefix"})
    base = sample_buckets(plain, None, 512).requests["short"]
    sampled = sample_buckets(parse_workload(tiny_workload()), None, 512)
    reqs = sampled.requests["short"]
    carriers = [r for r in reqs if r.prefix_group is not None]
    assert len(carriers) == 6  # round(0.75 x 8)
    assert sorted(r.prefix_group for r in carriers) == [0, 0, 0, 1, 1, 1]  # groups dealt in turn
    assert sorted(r.tenant for r in reqs) == [0, 0, 0, 0, 1, 1, 1, 1]
    prefixes = {r.prefix_group: r.prompt_token_ids[:PREFIX] for r in carriers}
    assert len(prefixes) == 2 and prefixes[0] != prefixes[1]
    for r, own in zip(reqs, base):
        cut = PREFIX if r.prefix_group is not None else 0
        assert r.num_prefix_tokens == cut
        assert r.prompt_token_ids[:cut] == prefixes.get(r.prefix_group, ())
        assert r.prompt_token_ids[cut:] == own.prompt_token_ids and r.max_tokens == own.max_tokens
        assert all(0 <= t < 512 for t in r.prompt_token_ids)
    assert sample_buckets(parse_workload(tiny_workload()), None, 512) == sampled  # seeded
    info = sampled.dataset_info["shared_prefix"]
    assert (info["num_tokens"], info["sources"]) == (PREFIX, ["random", "random"])


def words(texts):
    """A stand-in tokenizer whose tokens are the words: easy to check against the text."""
    return [[len(w) for w in t.split()] for t in texts]


def test_sharegpt_prefixes_are_the_opening_of_real_long_turns():
    data = tiny_workload({"num_tokens": 300, "num_prefixes": 3})
    data["engine"]["model"] = "SmolLM2-135M-Instruct"
    data["dataset"] = "sharegpt"
    data["buckets"][0]["input_tokens"] = [5, 40]
    data["buckets"][0]["output_tokens"] = [5, 400]
    sampled = sample_buckets(parse_workload(data), words, 49_152)
    records = read_sharegpt()
    sources = sampled.dataset_info["shared_prefix"]["sources"]
    assert len(set(sources)) == 3
    by_group = {r.prefix_group: r.prompt_token_ids[:300] for r in sampled.requests["short"]}
    for group, source in enumerate(sources):
        _, record, turn = source.split(":")
        text = records[int(record)]["conversations"][int(turn)]["value"]
        assert len(text.split()) >= 300
        assert by_group[group] == tuple(len(w) for w in text.split()[:300])


def test_too_few_long_sharegpt_turns_name_the_field():
    data = tiny_workload({"num_tokens": 10**6})
    data["engine"].update(model="SmolLM2-135M-Instruct", max_model_len=None)
    data["dataset"] = "sharegpt"
    data["buckets"][0]["output_tokens"] = [5, 400]
    with pytest.raises(
        KvplanError,
        match=r"^<memory>: shared_prefix.num_tokens: only 0 ShareGPT turns hold"
        r" 1000000 tokens and num_prefixes asks for 1; lower num_tokens",
    ):
        sample_buckets(parse_workload(data), words, 49_152)


# ---- the estimate with the prefix counted once, on hand-made records -------------------------
def request(index, group, salt, admitted, finished, preemptions=0):
    return RequestRecord(
        f"b/closed/4/cached/{index}",
        "b",
        "closed",
        4.0,
        0.0,
        admitted,
        finished,
        (finished,),
        30,
        5,
        5,
        "length",
        num_preemptions=preemptions,
        variant="cached",
        prefix_group=group,
        cache_salt=salt,
    )


def step(start, end, resident, paged_bytes, ids=None):
    ids = tuple(f"b/closed/4/cached/{i}" for i in range(len(resident))) if ids is None else ids
    return StepRecord(
        7,
        "b",
        "closed",
        4.0,
        start,
        end,
        0,
        len(resident),
        len(resident),
        0,
        0,
        0,
        96,
        0,
        0,
        0,
        0,
        0,
        tuple(resident),
        0,
        paged_bytes,
        0,
        0,
        variant="cached",
        kv_resident_request_ids=ids,
    )


def by_id(reqs):
    return {r.request_id: r for r in reqs}


def test_the_estimate_counts_each_groups_prefix_once_per_salt():
    pricing = PrefixPricing(full_tokens=16, shared_bytes=16 * BYTES_PER_TOKEN)
    reqs = [
        request(0, 0, "t0", admitted=1.0, finished=9.0),
        request(1, 0, "t0", admitted=2.0, finished=9.0),
        request(2, 0, "t1", admitted=2.0, finished=9.0),  # same prefix, another tenant
        request(3, None, "t0", admitted=2.0, finished=9.0),  # no prefix
        request(4, 0, "t0", admitted=3.0, finished=9.0),  # not holding KV in the step below
        request(5, 1, "t0", admitted=0.5, finished=2.5),  # not holding KV in the step below
        request(6, 0, "t0", admitted=2.0, finished=9.0),  # still prefilling: 12 tokens < 16
    ]
    ids = tuple(f"b/closed/4/cached/{i}" for i in (0, 1, 2, 3, 6))
    s = step(start=2.0, end=2.9, resident=(40, 30, 30, 14, 12), paged_bytes=37 * BLOCK * BYTES_PER_TOKEN, ids=ids)
    held = residents(s, by_id(reqs))
    assert [r.request_id[-1] for r in held] == ["0", "1", "2", "3", "6"]  # as the engine named them
    # Group 0 under salt t0 has 2 holders of its 16 full-block tokens (request 6 holds 12): one copy saved.
    assert shared_prefix_estimate_bytes(s, held, pricing) == (37 * BLOCK - 16) * BYTES_PER_TOKEN


def test_the_estimate_is_not_told_when_records_cannot_place_the_requests():
    reqs = by_id([request(0, 0, "t0", 1.0, 9.0), request(1, 0, "t0", 1.0, 9.0, preemptions=1)])
    assert residents(step(2.0, 2.5, (20, 20), 0), reqs) is not None  # a preempted request is fine
    assert residents(step(2.0, 2.5, (20, 20, 20), 0), reqs) is None  # request 2 has no record
    assert residents(step(2.0, 2.5, (20,), 0, ids=()), reqs) is None  # the step names no requests


# ---- the load test, end to end on the tiny model ---------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from kvplan.run.loadtest import run_loadtest

    return load_run(run_loadtest(parse_workload(tiny_workload()), tmp_path_factory.mktemp("sp") / "run"))


def test_every_level_runs_cached_then_uncached_on_the_same_prompts(run):
    order = [(lv.level, lv.variant, lv.num_completed) for lv in run.result.levels]
    assert order == [(1.0, "cached", 8), (1.0, "uncached", 8), (4.0, "cached", 8), (4.0, "uncached", 8)]
    prompts = {}
    for r in run.requests:
        prompts.setdefault(r.request_id.rsplit("/", 1)[1], set()).add((r.num_prompt_tokens, r.prefix_group, r.tenant))
    assert len(prompts) == 8 and all(len(v) == 1 for v in prompts.values())
    for r in run.requests:
        index = r.request_id.rsplit("/", 1)[1]
        level = f"short/closed/{r.level:g}/{r.variant}"
        assert r.cache_salt == (f"{level}/tenant{r.tenant}" if r.variant == "cached" else f"{level}/{index}")


def test_hits_at_concurrency_1_follow_the_groups_and_tenants(run):
    # One request at a time: a carrier hits the prefix's 4 full blocks (16 tokens) exactly when
    # an earlier request of its group and tenant ran in the same level; nothing else is ever hit.
    seen, expected, got = set(), [], []
    for r in sorted(
        (r for r in run.requests if r.level == 1.0 and r.variant == "cached"),
        key=lambda r: int(r.request_id.rsplit("/", 1)[1]),
    ):
        key = (r.prefix_group, r.tenant)
        expected.append(16 if r.prefix_group is not None and key in seen else 0)
        seen.add(key)
        got.append(r.num_cached_tokens)
    assert got == expected and sum(expected) > 0
    uncached = [r for r in run.requests if r.variant == "uncached"]
    assert all(r.num_cached_tokens == 0 for r in uncached)


def test_hit_rates_per_level_match_the_requests(run):
    for lv, row in zip(run.result.levels[::2], run.result.prefix_caching):
        own = [r for r in run.requests if r.level == lv.level and r.variant == "cached"]
        assert lv.variant == "cached" and row.level == lv.level
        rate = sum(r.num_cached_tokens for r in own) / sum(r.num_prompt_tokens for r in own)
        assert row.prefix_hit_rate_cached == pytest.approx(rate)
        assert row.prefix_hit_rate_uncached == 0.0
    for s in run.steps:
        assert s.num_prefix_hit_tokens <= s.num_prefix_queried_tokens
        if s.variant == "uncached":
            assert s.num_prefix_hit_tokens == 0


def test_uncached_variant_is_exact_and_cached_lies_between_the_estimates(run):
    pricing = prefix_pricing(run.result)
    assert pricing == PrefixPricing(16, 16 * BYTES_PER_TOKEN)
    assert run.result.estimate.shared_prefix.shared_bytes_per_request == 16 * BYTES_PER_TOKEN
    told = 0
    for s in run.steps:
        blocks = sum(math.ceil(t / BLOCK) for t in s.kv_resident_tokens)
        assert s.paged_bytes == blocks * BLOCK * BYTES_PER_TOKEN
        if s.variant == "uncached":
            assert s.measured_bytes == s.paged_bytes
            continue
        held = residents(s, by_id(run.requests))
        if held is None:
            continue
        told += 1
        estimate = shared_prefix_estimate_bytes(s, held, pricing)
        assert estimate <= s.measured_bytes <= s.paged_bytes
        if s.level == 1.0:
            assert estimate == s.measured_bytes == s.paged_bytes  # one request: nothing to share
    cached_steps = sum(s.variant == "cached" for s in run.steps)
    assert told == cached_steps  # no preemption here: every step is told
    kv = run.result.kv
    assert (kv.max_paged_error_bytes, kv.num_shared_steps) == (0, cached_steps)


def test_the_report_shows_the_comparison(run):
    names = {p.name for p in run.run_dir.iterdir()}
    assert {"prefix_caching.png", "prefix_hit_rate.png", "kv_over_time.png"} <= names
    summary = (run.run_dir / "summary.md").read_text()
    assert "## Prefix caching: with against without, one run, one engine" in summary
    assert "| short | c=4 cached |" in summary and "| short | c=4 |" in summary
    row = run.result.prefix_caching[1]
    by = {lv.variant: lv for lv in run.result.levels if lv.level == 4.0}
    assert row.ttft_p50_ms_cached == by["cached"].ttft_ms.p50
    assert row.ttft_p50_ms_uncached == by["uncached"].ttft_ms.p50
    assert row.peak_measured_bytes_uncached == by["uncached"].peak_measured_bytes
