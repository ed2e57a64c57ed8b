"""A trace's prompts are built when a request is sent, not when the trace is read
(kvplan.traffic.trace.TracePrompt, issue 38: a replay's memory bounded by the requests in flight):
the ids are the module docstring's hash-block expansion, computed here independently; reading the
trace draws no block; a trace is never written to the sample cache."""

import numpy as np

from kvplan.traffic import trace as traffic_trace
from kvplan.traffic.samples import cached_sample
from kvplan.traffic.trace import sample_trace
from kvplan.workload.file import load_workload
from tests.kvplan.traffic.test_trace import BLOCK, LINES, write_trace, write_workload

VOCAB = 512


def expected_ids(seed: int, line: int, length: int, hash_ids) -> tuple[int, ...]:
    """Block h: BLOCK ids from default_rng([seed, 0, h]); a line without hash ids: [seed, 1, line, b]."""
    count = -(-length // BLOCK)
    keys = [[0, h] for h in hash_ids[:count]] if hash_ids is not None else [[1, line, b] for b in range(count)]
    ids = np.concatenate([np.random.default_rng([seed, *k]).integers(0, VOCAB, size=BLOCK) for k in keys])
    return tuple(int(t) for t in ids[:length])


def test_trace_prompts_are_the_hash_block_expansion_and_cost_nothing_until_read(tmp_path):
    write_trace(tmp_path / "t.jsonl")
    workload = load_workload(write_workload(tmp_path))
    traffic_trace._block.cache_clear()
    requests = sample_trace(workload, VOCAB).requests["trace"]
    assert traffic_trace._block.cache_info().currsize == 0  # nothing drawn yet
    assert [len(r.prompt_token_ids) for r in requests] == [length for _, length, _, _ in LINES]
    for line, (request, (_, length, _, hash_ids)) in enumerate(zip(requests, LINES, strict=True), start=1):
        want = expected_ids(workload.seed, line, length, hash_ids)
        assert tuple(request.prompt_token_ids) == want
        assert request.prompt_token_ids == want and list(request.prompt_token_ids) == list(want)
        assert request.prompt_token_ids[3:9] == want[3:9] and request.prompt_token_ids[-1] == want[-1]
    again = sample_trace(workload, VOCAB).requests["trace"]
    assert again == requests and hash(again[1].prompt_token_ids) == hash(requests[1].prompt_token_ids)
    assert requests[0].prompt_token_ids != requests[1].prompt_token_ids  # block 3 vs 5


def test_a_trace_is_not_kept_in_the_sample_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVPLAN_CACHE", str(tmp_path / "cache"))
    write_trace(tmp_path / "t.jsonl")
    workload = load_workload(write_workload(tmp_path))
    sampled = cached_sample(workload, _no_tokenizer, VOCAB, [])
    assert sampled.requests == sample_trace(workload, VOCAB).requests
    assert not (tmp_path / "cache").exists()


def _no_tokenizer():
    raise AssertionError("a tokenizer was built for prompts that hold no text")


def test_random_prompts_build_no_tokenizer(tmp_path, monkeypatch):
    """Random token ids (shared random prefixes too) need no tokenizer: none is built, and the
    requests are those sample_buckets draws without one."""
    from kvplan.traffic.prompts import sample_buckets

    monkeypatch.setenv("KVPLAN_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "r.yaml"
    path.write_text(
        "name: r\nseed: 3\ndataset: random\nshared_prefix: {num_tokens: 32, num_prefixes: 2}\n"
        "buckets:\n  - {name: b, input_tokens: [40, 90], output_tokens: 8, concurrency: [2], num_requests: 6}\n"
    )
    workload = load_workload(path)
    sampled = cached_sample(workload, _no_tokenizer, VOCAB, [])
    assert sampled.requests == sample_buckets(workload, None, VOCAB).requests
    requests = sampled.requests["b"]
    assert len(requests) == 6 and len({r.prompt_token_ids[:32] for r in requests}) == 2  # the 2 random prefixes
    assert not (tmp_path / "cache").exists()
