"""A streamed answer -> one finished request: TTFT at the first text, k tokens per chunk, the
source of the output count, and failures by reason."""

import json

from kvplan.run.server.client import HttpResult
from kvplan.run.server.sse import chunk_tokens, to_finished


def sse(*objs) -> tuple:
    return tuple((float(t), json.dumps(o).encode() if o != "[DONE]" else b"[DONE]") for t, o in objs)


def chat(text=None, finish=None, role=False):
    delta = {"role": "assistant"} if role else {"content": text}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_ttft_skips_the_role_only_chunk_and_a_chunk_of_k_tokens_counts_k_times():
    events = sse(
        (10, chat(role=True)),
        (11, chat("")),
        (12, chat("ab")),
        (13, chat("cde", "length")),
        (13.5, {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}),
        (14, "[DONE]"),
    )
    out = to_finished(
        HttpResult("r", 9.0, 14.0, 200, events), arrival_time=9.0, num_prompt_tokens=3, count_tokens=len
    )  # one token per character
    assert out.token_times == (12.0, 12.0, 13.0, 13.0, 13.0)  # 2 tokens at 12, 3 at 13: TTFT = 3 s
    assert (out.num_output_tokens, out.output_tokens_source, out.num_prompt_tokens) == (5, "usage", 9)
    assert (out.finish_reason, out.finish_time, out.sent_time) == ("length", 13.5, 9.0)


def test_the_cached_prompt_tokens_are_the_usage_s_prompt_tokens_details():
    """vLLM with --enable-prompt-tokens-details (and OpenAI) put the prefix-cache hits of a request
    in ``usage.prompt_tokens_details.cached_tokens``; without it (or with a null) they count 0."""

    def finished(usage):
        events = sse(
            (1, {"choices": [{"text": "ab", "finish_reason": "length"}]}), (2, {"choices": [], "usage": usage})
        )
        return to_finished(
            HttpResult("r", 0.5, 3, 200, events), arrival_time=0.5, num_prompt_tokens=4, count_tokens=None
        )

    base = {"prompt_tokens": 416, "completion_tokens": 2}
    assert finished({**base, "prompt_tokens_details": {"cached_tokens": 384}}).num_cached_tokens == 384
    assert finished({**base, "prompt_tokens_details": None}).num_cached_tokens == 0
    assert finished(base).num_cached_tokens == 0


def test_without_usage_the_tokenizer_counts_and_without_one_each_chunk_is_a_token():
    events = sse((1, {"choices": [{"text": "ab"}]}), (2, {"choices": [{"text": "c", "finish_reason": "stop"}]}))
    by_tokenizer = to_finished(
        HttpResult("r", 0.5, 3, 200, events), arrival_time=0.5, num_prompt_tokens=4, count_tokens=len
    )
    assert (by_tokenizer.token_times, by_tokenizer.output_tokens_source) == ((1.0, 1.0, 2.0), "tokenizer")
    by_chunks = to_finished(
        HttpResult("r", 0.5, 3, 200, events), arrival_time=0.5, num_prompt_tokens=4, count_tokens=None
    )
    assert (by_chunks.token_times, by_chunks.output_tokens_source) == ((1.0, 2.0), "chunks")
    assert by_chunks.num_prompt_tokens == 4 and by_chunks.finish_reason == "stop"


def test_reasoning_text_starts_the_first_token():
    events = sse((5, {"choices": [{"delta": {"reasoning_content": "hmm"}}]}), (6, chat("ok", "stop")))
    out = to_finished(HttpResult("r", 1, 7, 200, events), arrival_time=1, num_prompt_tokens=1, count_tokens=None)
    assert out.token_times == (5.0, 6.0)


def test_failures_carry_their_reason():
    shed = to_finished(
        HttpResult("r", 1, 2, 429, (), "http 429"), arrival_time=1, num_prompt_tokens=1, count_tokens=None
    )
    assert (shed.finish_reason, shed.finish_detail) == ("rejected", "http 429")  # the server shed it: not a failure
    cases = [
        (HttpResult("r", 1, 2, 0, (), "timeout"), "timeout"),
        (HttpResult("r", 1, 2, 200, sse((1.5, chat("a")))), "stream ended early"),
        (HttpResult("r", 1, 2, 200, sse((1.5, chat("", "stop")), (1.6, "[DONE]"))), "empty output"),
        (HttpResult("r", 1, 2, 200, sse((1.5, {"error": {"message": "boom"}}))), "error event"),
    ]
    for result, reason in cases:
        out = to_finished(result, arrival_time=1, num_prompt_tokens=1, count_tokens=None)
        assert (out.finish_reason, out.finish_detail) == ("error", reason)


def test_chunk_shares_sum_to_the_total():
    assert chunk_tokens(["a", "b", "c"], 3, None) == [1, 1, 1]
    assert chunk_tokens(["a", "b"], 5, None) == [1, 4]  # no tokenizer: the rest on the last chunk
    assert chunk_tokens(["ab", "cd", "e"], 4, len) == [2, 2, 0]  # tokenizer says 5: one taken from the end
    assert chunk_tokens(["ab", "cd"], 6, len) == [2, 4]
