"""Prompt sources: ShareGPT read record by record up to its cut, random lengths, JSONL, sampling."""

import json

import numpy as np
import pytest

from kvplan.errors import KvplanError
from kvplan.traffic.prompts import draw_lengths, read_sharegpt, sample_buckets, sharegpt_pairs
from kvplan.workload.buckets import Lengths
from kvplan.workload.file import parse_workload


def words(texts):
    """A stand-in tokenizer whose token count is the word count: easy to check by hand."""
    return [[len(w) % 50 for w in t.split()] for t in texts]


def workload(dataset="random", buckets=None, seed=0, source="<memory>"):
    buckets = buckets or [
        {"name": "a", "input_tokens": [4, 8], "output_tokens": [2, 6], "concurrency": [1], "num_requests": 5}
    ]
    return parse_workload({"name": "w", "seed": seed, "dataset": dataset, "buckets": buckets}, source)


def turn(who, text):
    return {"from": who, "value": text}


def test_sharegpt_reader_stops_cleanly_at_a_cut_record(tmp_path):
    records = [
        {"id": "a", "conversations": [turn("human", "hi there"), turn("gpt", "hello")]},
        {"id": "b", "conversations": [turn("gpt", "sys"), turn("human", "q"), turn("gpt", "r s t")]},
    ]
    text = "[\n" + ",\n".join(json.dumps(r) for r in records) + ',\n{"id": "c", "conversations": [{"from": "hu'
    path = tmp_path / "cut.json"
    path.write_text(text)
    assert read_sharegpt(path) == records


def test_installed_sharegpt_file_yields_17671_whole_conversations():
    records = read_sharegpt()
    assert len(records) == 17_671  # ../shared/ENVIRONMENT.md
    assert records[0]["id"] == "QWJhYvA_0"


def test_pairs_take_the_first_human_turn_and_the_reply_after_it():
    records = [
        {"conversations": [turn("gpt", "preamble"), turn("human", "Q1"), turn("gpt", "A1"), turn("human", "Q2")]},
        {"conversations": [turn("human", "alone")]},  # no reply
        {"conversations": [turn("human", "Q"), turn("human", "again"), turn("gpt", "late")]},  # no reply after it
        {"conversations": [turn("human", ""), turn("gpt", "empty prompt")]},
        {"conversations": []},
    ]
    assert sharegpt_pairs(records) == [(0, "Q1", "A1")]


def test_fixed_and_uniform_lengths():
    rng = np.random.default_rng(0)
    assert draw_lengths(Lengths(min=7, max=7, dist="fixed"), 3, rng).tolist() == [7, 7, 7]
    uniform = draw_lengths(Lengths(min=4, max=6), 3000, rng)
    assert set(uniform.tolist()) == {4, 5, 6}  # inclusive at both ends


def test_normal_and_lognormal_lengths_have_the_asked_moments():
    rng = np.random.default_rng(1)
    normal = draw_lengths(Lengths(min=1, max=10_000, dist="normal", mean=500, std=50), 20_000, rng)
    assert normal.mean() == pytest.approx(500, rel=0.01) and normal.std() == pytest.approx(50, rel=0.03)
    # Lognormal given by the lengths' own mean 300 and std 150 (not the underlying normal's).
    logn = draw_lengths(Lengths(min=1, max=100_000, dist="lognormal", mean=300, std=150), 40_000, rng)
    assert logn.mean() == pytest.approx(300, rel=0.02) and logn.std() == pytest.approx(150, rel=0.05)
    clipped = draw_lengths(Lengths(min=90, max=110, dist="normal", mean=100, std=1000), 1000, rng)
    assert clipped.min() == 90 and clipped.max() == 110


def test_random_buckets_are_deterministic_for_the_seed():
    first = sample_buckets(workload(seed=3), None, vocab_size=512).requests["a"]
    again = sample_buckets(workload(seed=3), None, vocab_size=512).requests["a"]
    other = sample_buckets(workload(seed=4), None, vocab_size=512).requests["a"]
    assert first == again and first != other
    assert len(first) == 5
    for r in first:
        assert 4 <= r.num_prompt_tokens <= 8 and 2 <= r.max_tokens <= 6
        assert all(0 <= t < 512 for t in r.prompt_token_ids)


def test_sharegpt_buckets_use_real_lengths_within_the_ranges():
    buckets = [
        {"name": "short", "input_tokens": [5, 20], "output_tokens": [10, 60], "concurrency": [1], "num_requests": 6},
        {
            "name": "long",
            "input_tokens": [100, 400],
            "output_tokens": [100, 400],
            "concurrency": [1],
            "num_requests": 3,
        },
    ]
    sampled = sample_buckets(workload("sharegpt", buckets, seed=7), words, vocab_size=49_152)
    assert sampled.dataset_info["num_conversations"] == 17_671
    pairs = {index: (prompt, reply) for index, prompt, reply in sharegpt_pairs(read_sharegpt())}
    for name, (lo, hi) in (("short", (5, 20)), ("long", (100, 400))):
        assert len(sampled.requests[name]) == buckets[0 if name == "short" else 1]["num_requests"]
        for r in sampled.requests[name]:
            prompt, reply = pairs[int(r.source.split(":")[1])]
            assert r.num_prompt_tokens == len(prompt.split()) and lo <= r.num_prompt_tokens <= hi
            assert r.max_tokens == len(reply.split())  # the real reply's length is the output length
    again = sample_buckets(workload("sharegpt", buckets, seed=7), words, vocab_size=49_152)
    assert again.requests == sampled.requests


def test_jsonl_prompts_text_or_ids_with_optional_output_length(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"prompt": "one two three four five", "output_tokens": 3}),
                json.dumps({"prompt_token_ids": [1, 2, 3, 4, 5, 6], "output_tokens": 4}),
                json.dumps({"prompt": "a b c d e f g"}),  # output length drawn from the bucket's range
                json.dumps({"prompt": "too short"}),
            ]
        )
        + "\n"
    )
    w = workload(
        {"jsonl": "p.jsonl"},
        [{"name": "a", "input_tokens": [5, 8], "output_tokens": [2, 6], "concurrency": [1], "num_requests": 3}],
        source=str(tmp_path / "w.yaml"),
    )
    got = sorted(sample_buckets(w, words, vocab_size=512).requests["a"], key=lambda r: r.source)
    assert [(r.source, r.num_prompt_tokens) for r in got] == [("jsonl:1", 5), ("jsonl:2", 6), ("jsonl:3", 7)]
    assert got[0].max_tokens == 3 and got[1].max_tokens == 4 and 2 <= got[2].max_tokens <= 6
    assert got[1].prompt_token_ids == (1, 2, 3, 4, 5, 6)


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    w_source = str(tmp_path / "w.yaml")
    path.write_text('{"prompt": "ok"}\n{"prompt": 5}\n')
    with pytest.raises(KvplanError, match=r"p.jsonl: line 2: needs prompt \(text\) or prompt_token_ids"):
        sample_buckets(workload({"jsonl": "p.jsonl"}, source=w_source), words, 512)
    path.write_text('{"prompt": "ok", "output_tokens": 0}\n')
    with pytest.raises(KvplanError, match=r"line 1: output_tokens: must be an integer >= 1 \(got 0\)"):
        sample_buckets(workload({"jsonl": "p.jsonl"}, source=w_source), words, 512)
    path.write_text('{"prompt": "one two three four"}\n')
    with pytest.raises(KvplanError, match="has text prompts and the model has no tokenizer"):
        sample_buckets(workload({"jsonl": "p.jsonl"}, source=w_source), None, 512)


def test_a_bucket_that_cannot_be_filled_names_itself(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt_token_ids": [1, 2, 3, 4, 5]}\n')
    w = workload({"jsonl": "p.jsonl"}, source=str(tmp_path / "w.yaml"))
    with pytest.raises(KvplanError, match=r"w.yaml: buckets\[0\]: only 1 of 5 JSONL prompts fit input_tokens \[4, 8\]"):
        sample_buckets(w, words, 512)
