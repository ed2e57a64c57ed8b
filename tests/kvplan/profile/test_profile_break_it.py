"""A break-it pass over `kvplan profile`'s inputs: seeded generators of bad and odd logs in each format
family (OpenAI-style JSONL with sessions, Mooncake traces, kvplan request logs with sessions), each
file run through the CLI in-process. Every input must end in exit 0 (bad lines counted) or exit 2
with one `error:` line naming the log and its line (or the file's own fault: empty, gzip), never a
traceback, a numpy warning or more than 10 s. Then the cases the pass found, one test each."""

from __future__ import annotations

import gzip
import json
import random
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kvplan.cli_runner import run_cli

NUM_CASES = 210  # per family
SECONDS_PER_INPUT = 10.0
FILE_FAULTS = ("empty log", "is gzip-compressed", "cannot read the log")
NASTY = [1e308, -1e308, 10**30, -(10**30), -1, -0.5, 0, 2.5, float("nan"), float("inf"), float("-inf")]
WRONG = ["12", "", [], [1, 2], {}, {"a": 1}, True, False, None]


def tiny_tokenizer(folder: Path) -> Path:
    """A tokenizer.json of one token per whitespace-separated word (all unknown): no SmolLM2 needed."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


# records of each family, good ones first, then one field broken


def openai_record(rng: random.Random, i: int, t: float) -> dict:
    words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(rng.randint(1, 40)))
    row: dict = {"timestamp": t}
    kind = rng.randrange(5)
    if kind == 0:
        row |= {"prompt": words, "output": "ok " * rng.randint(1, 5)}
    elif kind == 1:
        row |= {
            "prompt": words,
            "usage": {"prompt_tokens": rng.randint(1, 900), "completion_tokens": rng.randint(1, 90)},
        }
    elif kind == 2:  # content as a list of parts
        parts = [{"type": "text", "text": words}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
        row |= {"messages": [{"role": "user", "content": parts}], "completion": "fine"}
    elif kind == 3:  # a session's turn, its history resent
        turns = [{"role": "user", "content": words}, {"role": "assistant", "content": "a"}] * rng.randint(0, 3)
        row |= {"session_id": f"s{i % 3}", "messages": [*turns, {"role": "user", "content": words}], "output": "b"}
    else:
        row |= {"created": int(t), "conversation_id": i % 2, "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
        row.pop("timestamp")
        row["e2e_ms"] = rng.uniform(1, 5000)
    if rng.random() < 0.3:
        row["latency_s"] = rng.uniform(0, 3)
    if rng.random() < 0.2:
        row["timestamp"] = f"2024-05-01T00:00:{int(t) % 60:02d}Z"
    return row


def mooncake_record(rng: random.Random, i: int, t: float) -> dict:
    n = rng.randint(1, 3000)
    return {
        "timestamp": int(t * 1000),
        "input_length": n,
        "output_length": rng.randint(1, 400),
        "hash_ids": [rng.randrange(20) for _ in range(-(-n // 512))],
    }


def kvplan_record(rng: random.Random, i: int, t: float) -> dict:
    row = {
        "request_id": f"r{i}",
        "arrival_time": t,
        "num_prompt_tokens": rng.randint(1, 2000),
        "max_tokens": rng.randint(1, 200),
        "num_cached_tokens": rng.randint(0, 100),
        "finish_time": t + rng.uniform(0, 2),
        "bucket": "short",
        "mode": rng.choice(["open", "closed"]),
        "level": rng.choice([2, 8]),
        "variant": rng.choice(["", "cached"]),
    }
    if rng.random() < 0.5:
        row["session"] = i % 4
    return row


KEYS = {
    "openai": ["timestamp", "created", "prompt", "messages", "output", "completion", "usage", "session_id", "e2e_ms"],
    "mooncake": ["timestamp", "input_length", "output_length", "hash_ids"],
    "kvplan": ["request_id", "arrival_time", "num_prompt_tokens", "max_tokens", "num_cached_tokens", "finish_time"],
}


def break_record(rng: random.Random, row: dict, family: str) -> dict:
    """One field missing, of a wrong type, huge, negative, NaN/Infinity, or a malformed part."""
    key = rng.choice(KEYS[family])
    how = rng.randrange(6)
    if how == 0:
        row.pop(key, None)
    elif how == 1:
        row[key] = rng.choice(WRONG)
    elif how == 2:
        row[key] = rng.choice(NASTY)
    elif how == 3 and family == "openai":
        row["messages"] = rng.choice(
            [
                [{"role": "user", "content": [{"type": "text", "text": 5}]}],
                [{"role": "user", "content": ["bare"]}],
                [{"role": "user", "content": [{"text": "no type"}]}],
                [{"role": "user", "content": 7}],
                ["not a message"],
                [{"role": ["odd"], "content": [{"type": "text", "text": "x"}, {"type": "input_audio"}]}],
            ]
        )
    elif how == 3 and family == "mooncake":
        row["hash_ids"] = rng.choice([[-1], [1.5], ["a"], [10**30], [True], {"0": 1}, list(range(5000))])
    elif how == 4:
        row["usage" if family == "openai" else key] = {"prompt_tokens": rng.choice(NASTY), "completion_tokens": "x"}
    else:
        row[rng.choice(KEYS[family])] = rng.choice(NASTY + WRONG)
    return row


RECORDS: dict[str, Callable[[random.Random, int, float], dict]] = {
    "openai": openai_record,
    "mooncake": mooncake_record,
    "kvplan": kvplan_record,
}


def deep(levels: int = 3000) -> str:
    return "[" * levels + "]" * levels


def long_line(rng: random.Random, family: str) -> str:
    """A line of about 1 MB: a long text, a long list of hash ids, or long padding."""
    row = RECORDS[family](rng, 0, 1.0)
    if family == "openai" and rng.random() < 0.5:
        row = {"timestamp": 1.0, "prompt": "word " * 200_000, "usage": {"completion_tokens": 3}}
    elif family == "mooncake" and rng.random() < 0.5:
        # 2**22 tokens expanded (about 1.5 s); the cap, 2**24, takes about 6 s on one core
        row |= {"input_length": rng.choice([2**22, 3000]), "hash_ids": [0] * 330_000}
    else:
        row["padding"] = "x" * 1_000_000
    return json.dumps(row)


def generate(family: str, seed: int) -> tuple[str, bytes, bool]:
    """One file of ``family``: (suffix, bytes, run it with --out too)."""
    rng = random.Random(seed)
    forced = seed % 1000  # the first cases of each family: one of each listed fault alone
    if forced == 0:
        return ".jsonl", b"", False
    if forced == 1:
        return ".jsonl", b"\n  \n\r\n\t\n", False
    if forced == 2:
        return ".jsonl", bytes(rng.randrange(256) for _ in range(4096)), False
    if forced == 3:
        return ".jsonl", (deep() + "\n").encode(), False
    if forced == 4:
        return ".jsonl", b'1\n"text"\n[1, 2]\nnull\ntrue\n3.5\n', False
    times = [rng.uniform(0, 100) for _ in range(rng.randint(1, 12))]
    if rng.random() < 0.7:
        times.sort()  # else unsorted timestamps
    rows: list = [RECORDS[family](rng, i, t) for i, t in enumerate(times)]
    if rng.random() < 0.3 and rows:  # duplicate request ids / whole duplicate lines
        rows.extend(dict(rows[0]) for _ in range(rng.randint(1, 3)))
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        if rows:
            i = rng.randrange(len(rows))
            rows[i] = break_record(rng, rows[i], family)
    lines = [json.dumps(r) for r in rows]
    for _ in range(rng.choice([0, 0, 1, 2])):  # odd lines among the records
        odd = rng.choice(["", "   ", "{", deep(), "[]", "42", '"s"', "NaN", "{'single': 1}", "\x00\x01", "}{"])
        lines.insert(rng.randrange(len(lines) + 1), odd)
    if forced == 5 or rng.random() < 0.06:
        lines.insert(rng.randrange(len(lines) + 1), long_line(rng, family))
    text = "\n".join(lines) + rng.choice(["\n", "", "\n\n"])
    if rng.random() < 0.15 and text:  # a record cut mid-line
        text = text[: rng.randrange(len(text))]
    end = rng.choice(["\n", "\n", "\r\n", "\r"])  # LF, CRLF, or old-Mac CR only
    data = text.replace("\n", end).encode()
    if rng.random() < 0.2:
        data = b"\xef\xbb\xbf" + data
    if rng.random() < 0.05:  # bytes that are not UTF-8 on one line
        data += b"\n\xff\xfe{\x80}\n"
    suffix = ".jsonl"
    if forced == 6 or rng.random() < 0.08:
        data = gzip.compress(data)
        suffix = rng.choice([".jsonl.gz", ".jsonl"])
    return suffix, data, seed % 5 == 0


def profile(path: Path, *args: str) -> tuple[int, str, str, list[str]]:
    """run_cli, and the warnings it raised (a numpy overflow is a broken input too)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = run_cli("profile", str(path), *args)
    return code, out, err, [f"{w.category.__name__}: {w.message}" for w in caught]


def judge(path: Path, *args: str) -> str | None:
    """What is wrong with profiling ``path`` (None: nothing)."""
    start = time.perf_counter()
    try:
        code, out, err, caught = profile(path, *args)
    except Exception as exc:  # noqa: BLE001 - a traceback is the failure this test looks for
        return f"raised {type(exc).__name__}: {str(exc)[:200]}"
    took = time.perf_counter() - start
    if took > SECONDS_PER_INPUT:
        return f"took {took:.1f} s"
    if caught:
        return f"warned {caught[0][:200]}"
    if "Traceback" in out + err:
        return "printed a traceback"
    if code == 0:
        if any(not line.startswith("warning: ") for line in err.splitlines()):
            return f"exit 0 with stderr {err[:200]!r}"
        return None
    if code != 2:
        return f"exit {code}: {err[:200]!r}"
    if err.count("\n") != 1 or not err.startswith(f"error: {path}: "):
        return f"not one error line naming the log: {err[:300]!r}"
    rest = err[len(f"error: {path}: ") :]
    # a line of the log, the file itself, or (--out) the workload key the log's traffic does not fit
    if not re.match(r"(line \d+|out: [\w.\[\]]+): \S", rest) and not rest.startswith(FILE_FAULTS):
        return f"error names no line: {err[:300]!r}"
    return None


def break_family(family: str, tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
    failures = []
    seed0 = {"openai": 1000, "mooncake": 2000, "kvplan": 3000}[family]
    for seed in range(seed0, seed0 + NUM_CASES):
        suffix, data, with_out = generate(family, seed)
        path = tmp_path / f"{family}-{seed}{suffix}"
        path.write_bytes(data)
        for args in [extra, (*extra, "--out", str(tmp_path / f"w{seed}.yaml"))] if with_out else [extra]:
            problem = judge(path, *args)
            if problem is not None:
                failures.append(f"{family} seed {seed} {' '.join(args)}: {problem}")
        path.unlink()
    assert not failures, "\n".join(failures)


def test_openai_logs_never_break(tmp_path):
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    break_family("openai", tmp_path, ("--tokenizer", str(tokenizer), "--model", "tiny-random-llama"))


def test_mooncake_traces_never_break(tmp_path):
    break_family("mooncake", tmp_path, ("--model", "tiny-random-llama"))


def test_kvplan_logs_never_break(tmp_path):
    break_family("kvplan", tmp_path, ("--model", "tiny-random-llama", "--level", "all"))


def test_the_generators_cover_every_listed_fault():
    blobs = [
        generate(f, s) for f, base in (("openai", 1000), ("mooncake", 2000)) for s in range(base, base + NUM_CASES)
    ]
    data = [d for _, d, _ in blobs]
    assert sum(d.startswith(b"\x1f\x8b") for d in data) >= 10  # gzip
    assert any(s == ".jsonl.gz" for s, d, _ in blobs if d.startswith(b"\x1f\x8b"))
    assert any(s == ".jsonl" for s, d, _ in blobs if d.startswith(b"\x1f\x8b"))
    assert sum(d.startswith(b"\xef\xbb\xbf") for d in data) >= 20  # BOM
    assert sum(b"\r\n" in d for d in data) >= 20 and sum(b"\r" in d and b"\r\n" not in d for d in data) >= 20
    assert sum(len(d) > 1_000_000 for d in data) >= 10 and sum(b"[" * 3000 in d for d in data) >= 10
    assert sum(b"NaN" in d for d in data) >= 10 and sum(b"Infinity" in d for d in data) >= 10
    assert sum(b"1e+308" in d for d in data) >= 10 and sum(str(10**30).encode() in d for d in data) >= 10


# the cases the pass found, each fixed in kvplan/profile/log.py or profile_workload.py


def one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


GOOD = '{"timestamp": 0, "input_length": 5, "output_length": 3}'


def test_a_deeply_nested_line_is_a_bad_line_not_a_recursion_error(tmp_path):
    # json's decoder raised RecursionError (a traceback) at 3000 levels
    log = tmp_path / "deep.jsonl"
    log.write_text(deep() + "\n" + GOOD + "\n")
    code, out, err, _ = profile(log, "--json")
    assert code == 0 and json.loads(out)["bad_lines"] == ["line 1: json: nested too deeply to read"]
    log.write_text('{"a":' * 3000 + "1" + "}" * 3000 + "\n")
    code, out, err, _ = profile(log)
    assert code == 2 and one_error_line(err) == f"error: {log}: line 1: json: nested too deeply to read"


@pytest.mark.parametrize("name", ["trace.jsonl.gz", "trace.jsonl"])
def test_a_gzip_log_is_one_line_saying_so(tmp_path, name):
    # was "cannot read the log ('utf-8' codec can't decode byte 0x8b in position 1: invalid start byte)"
    log = tmp_path / name
    log.write_bytes(gzip.compress((GOOD + "\n").encode()))
    code, out, err, _ = profile(log)
    assert code == 2 and one_error_line(err) == f"error: {log}: is gzip-compressed; gunzip it and give the JSONL file"


def test_a_line_that_is_not_utf8_is_a_bad_line_naming_it(tmp_path):
    # one such byte made the whole log unreadable, without a line number
    log = tmp_path / "mixed.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\r\n\xff\xfe{}\r\n")
    code, out, err, _ = profile(log, "--json")
    assert code == 0 and json.loads(out)["bad_lines"] == ["line 2: utf-8: not UTF-8 text (byte 0xff at column 1)"]
    log.write_bytes(b"\n\x00\x9c\x80junk")
    code, out, err, _ = profile(log)
    assert code == 2 and one_error_line(err) == f"error: {log}: line 2: utf-8: not UTF-8 text (byte 0x9c at column 2)"


def test_times_near_1e308_are_bad_lines_not_overflow_warnings(tmp_path):
    # arrival_time -1e308 and 1e308 overflowed numpy's span and gaps (RuntimeWarning on stderr)
    rows = [
        {"request_id": 1, "arrival_time": -1e308, "num_prompt_tokens": 5, "max_tokens": 3, "finish_time": 1e308},
        {"request_id": 2, "arrival_time": 1e308, "num_prompt_tokens": 5, "max_tokens": 3},
        {"request_id": 3, "arrival_time": 1.0, "num_prompt_tokens": 5, "max_tokens": 3, "finish_time": 2.0},
        {"timestamp": 1e300, "input_length": 5, "output_length": 3},
        {"timestamp": 2000, "usage": {"prompt_tokens": 5, "completion_tokens": 3}, "latency_s": 1e308},
    ]
    log = tmp_path / "far.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err, caught = profile(log, "--json", "--level", "all", "--out", str(tmp_path / "w.yaml"))
    assert code == 0 and caught == [], caught
    data = json.loads(out)
    assert data["num_requests"] == 1 and data["bad_lines"] == [
        "line 1: arrival_time: must be within +-1e+15 s (got -1e+308)",
        "line 2: arrival_time: must be within +-1e+15 s (got 1e+308)",
        "line 4: timestamp: must be within +-1e+15 s (got 1e+297)",
        "line 5: latency_s: must be within +-1e+15 s (got 1e+308)",
    ]


def test_a_length_above_the_workload_schemas_cap_is_a_bad_line_and_out_still_writes(tmp_path):
    # input_length 10**9 profiled (10**9 * 512-token blocks expanded: seconds a line), then --out
    # failed on the written file's own key: "w.yaml: buckets[0].mix[0].input_tokens.min: must be <= 16777216"
    rows = [
        {"timestamp": 0, "input_length": 10**9, "output_length": 3, "hash_ids": [0] * 330_000},
        {"timestamp": 1000, "input_length": 2**24 + 1, "output_length": 3},
        {"timestamp": 2000, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]},
    ]
    log = tmp_path / "long.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    start = time.perf_counter()
    code, out, err, _ = profile(log, "--json", "--out", str(tmp_path / "w.yaml"), "--model", "tiny-random-llama")
    assert time.perf_counter() - start < SECONDS_PER_INPUT
    assert code == 0 and (tmp_path / "w.yaml").is_file(), err
    assert json.loads(out)["bad_lines"] == [
        "line 1: input_length: must be at most 16,777,216 tokens (got 1e+09)",
        "line 2: input_length: must be at most 16,777,216 tokens (got 1.68e+07)",
    ]


def test_out_of_a_log_a_workload_cannot_hold_is_one_line_naming_the_log(tmp_path):
    # --out failed naming the workload file it had not written, not the log: a slow log's rate rounded
    # to 0, "error: w.yaml: buckets[0].request_rates[0]: must be > 0.0 (got 0.0)", and a think time
    # over the schema's 24 h, "error: w.yaml: dataset.sessions.think_time_s: must be at most 86400 s"
    fix = "; check the log's times (one clock, seconds) and lengths, or profile it without --out"
    rows = [{"timestamp": 1e11 * i, "input_length": 40, "output_length": 4} for i in range(4)]
    log = tmp_path / "slow.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err, _ = profile(log, "--out", str(tmp_path / "w.yaml"), "--model", "tiny-random-llama")
    line = one_error_line(err)
    assert code == 2 and line.startswith(f"error: {log}: out: buckets[0].request_rates[0]: ") and line.endswith(fix)
    rows = [  # sessions whose turns lie two days apart
        {"timestamp": 172_800 * t + s, "session_id": f"s{s}", "usage": {"prompt_tokens": 9, "completion_tokens": 2}}
        for s in range(3)
        for t in range(3)
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err, _ = profile(log, "--out", str(tmp_path / "w2.yaml"), "--model", "tiny-random-llama")
    line = one_error_line(err)
    assert code == 2 and line.startswith(f"error: {log}: out: dataset.sessions.think_time_s: must be at most")
    assert line.endswith(fix) and not (tmp_path / "w.yaml").exists() and not (tmp_path / "w2.yaml").exists()


def test_a_log_of_lines_in_several_formats_warns_that_their_clocks_differ(tmp_path):
    # a Mooncake line at 0 ms, a kvplan record at 1 s, an OpenAI line at 2026-01-01T00:00:01Z: once a
    # silent duration_s of 1,767,225,601 s (56 years) read off three clocks
    rows = [
        {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]},
        {"request_id": "a", "arrival_time": 1.0, "num_prompt_tokens": 5, "max_tokens": 3},
        {"timestamp": "2026-01-01T00:00:01Z", "prompt": "hi", "usage": {"prompt_tokens": 5, "completion_tokens": 3}},
    ]
    log = tmp_path / "mixed.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err, caught = profile(log, "--json")
    assert code == 0 and caught == [], caught
    assert json.loads(out)["duration_s"] == 1_767_225_601 - 0.0  # 2026-01-01T00:00:01Z in s since 1970
    assert err.splitlines() == [
        f"warning: {log}: lines of 3 formats (mooncake 1, kvplan 1, openai 1), each timed on its own clock:"
        " arrivals, duration_s and rates mix them; profile one format's lines, or force one with --format"
    ]
    # one format's lines: no such warning
    log.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[0], "timestamp": 500}) + "\n")
    code, out, err, _ = profile(log, "--json")
    assert code == 0 and json.loads(out)["duration_s"] == 0.5 and "formats" not in err, err


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("kind", ["mooncake", "csv"])
def test_a_level_for_a_log_of_no_levels_is_refused_not_ignored(tmp_path, kind, replay):
    # once exit 0, every request profiled: --level picks a kvplan run's load level, and none was there
    if kind == "mooncake":
        log, extra = tmp_path / "trace.jsonl", ()
        rows = [{"timestamp": t, "input_length": 10, "output_length": 5, "hash_ids": [1]} for t in (0, 500)]
        log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        log, extra = tmp_path / "trace.csv", ("--columns", "timestamp=time,input_tokens=in,output_tokens=out")
        log.write_text("time,in,out\n1,10,5\n2,12,6\n")
    out = ("--replay", "--out", str(tmp_path / "w.yaml")) if replay else ()
    code, _, err, _ = profile(log, *extra, "--level", "short/open/2", *out)
    assert code == 2 and not (tmp_path / "w.yaml").exists(), err
    assert err.splitlines() == [
        f"error: {log}: level: 'short/open/2': this log holds no load levels (only a kvplan run's"
        " requests.jsonl does); leave out --level"
    ]
    code, _, err, _ = profile(log, *extra, "--level", "all", *out)  # every level: all there is
    assert code == 0, err
