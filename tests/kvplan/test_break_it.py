"""Break-it pass over the workload YAML: seeded generators of bad ``mix:``, ``variants:``,
``sessions:``, ``arrival:``, ``engine.admission:`` sections and bad Mooncake trace files, each read
by ``load_workload`` (validation only, nothing runs). Every input must either load (a mutation that
is still valid) or raise one KvplanError line that names the file and the key or line, in under
10 s; any other exception is a traceback at the CLI. The inputs that broke it once are kept as
explicit cases (``FOUND``) with the message they now get."""

from __future__ import annotations

import copy
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvplan.errors import KvplanError
from kvplan.workload.file import load_workload
from tests.kvplan.cli_runner import run_cli

ENGINE = {
    "model": "tiny-random-llama",
    "dtype": "float32",
    "block_size": 4,
    "num_blocks": 64,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 64,
    "enable_prefix_caching": True,
    "admission": {"max_num_waiting": 4, "kv_admission_reserve": 0.0, "tenant_max_concurrency": 2},
}
MIX = {  # mix + arrival + admission + variants (tests/kvplan/data/mix_tiny.yaml, admission.yaml)
    "name": "break",
    "seed": 0,
    "engine": ENGINE,
    "dataset": "random",
    "slo": {"ttft_ms": 400, "tpot_ms": 100},
    "buckets": [
        {
            "name": "support",
            "mix": [
                {"name": "chat", "weight": 3, "input_tokens": [4, 12], "output_tokens": [4, 8], "tenant": "alice"},
                {"name": "doc", "weight": 1, "input_tokens": {"min": 8, "max": 16}, "output_tokens": 3},
            ],
            "concurrency": [4],
            "request_rates": [200],
            "num_requests": 16,
            "arrival": {"process": "gamma", "burstiness": 0.5, "ramp_up_s": 0.1},
        }
    ],
    "variants": [{"name": "chunk-16", "engine": {"max_num_batched_tokens": 16}}, {"name": "whole"}],
}
SESSIONS = {  # random sessions (tests/kvplan/data/sessions_tiny.yaml)
    **copy.deepcopy(MIX),
    "dataset": {"kind": "random", "sessions": {"max_turns": 3, "think_time_s": [0.01, 0.03]}},
    "buckets": [
        {"name": "chat", "input_tokens": [4, 10], "output_tokens": [3, 8], "concurrency": [4], "num_requests": 6}
    ],
}
JUNK: list[Any] = [
    None, True, False, -1, 0, 1, 0.5, 3.7, 1e308, -1e308, 1e-320, 10**30, -(10**30), 2**64, 2**63 - 1,
    math.nan, math.inf, -math.inf, "", " ", "abc", "1e999", "10", "-5", "nan", ".inf", "30s", "1e400s", "-1s",
    "😀" * 3, "x\ny", "\x00", "\t", "a" * 300, [], {}, [[]], [None], [1, "a"], [0, 0], [5, 1], [1, 2, 3],
    ["a", "b"], {"a": {"b": [1]}}, {"name": "x"}, [{"x": 1}], {"min": 5, "max": 1, "dist": "normal"},
    {"dist": "lognormal", "min": 1, "max": 9, "mean": 1e308, "std": 1e308},
]  # fmt: skip
UNKNOWN_KEYS = ["bogus", "Name", "max_turn", "1", "tenants", "weights", "burstines"]


def _paths(obj: Any, prefix: tuple = ()):
    if prefix:
        yield prefix
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        yield from _paths(value, (*prefix, key))


def _parent(doc: Any, path: tuple) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def mutate(rng: random.Random, base: dict, sections: tuple[str, ...]) -> dict:
    """``base`` with one to three changes under ``sections`` (top-level keys, or ``engine.admission``):
    a junk value, a key dropped or added, a list item duplicated (duplicated names) or a container emptied."""
    doc = copy.deepcopy(base)
    for _ in range(rng.choice([1, 1, 2, 3])):
        paths = [p for p in _paths(doc) if ".".join(map(str, p)).startswith(sections)]
        if not paths:
            break
        path = rng.choice(paths)
        parent, op = _parent(doc, path), rng.random()
        if op < 0.65:
            parent[path[-1]] = copy.deepcopy(rng.choice(JUNK))
        elif op < 0.75 and isinstance(parent, dict):
            parent.pop(path[-1])
        elif op < 0.85 and isinstance(parent, dict):
            parent[rng.choice(UNKNOWN_KEYS)] = copy.deepcopy(rng.choice(JUNK))
        elif op < 0.93 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[path[-1]]))  # a duplicated class, variant or level
        elif isinstance(parent[path[-1]], list | dict):
            parent[path[-1]].clear()
    return doc


def check_input(path: Path, failures: list[str], *others: Path) -> str:
    """Load ``path``; '' when it is valid, else the error line. A traceback, an error of more than
    one line, one that names neither the file (or one of ``others``, a file it refers to) nor a key
    or line, or a slow one goes to ``failures``."""
    start = time.perf_counter()
    try:
        load_workload(path)
        line = ""
    except KvplanError as err:
        line = str(err)
        # a key or line; or, for a file it refers to (a trace) unreadable or empty as a whole, that file
        names_key = bool(err.field) or "line " in err.problem or err.source in map(str, others)
        named = any(line.startswith(f"{source}: ") for source in (path, *others))
        if "\n" in line or "\r" in line or not named or not names_key:
            failures.append(f"{path.name}: not one line naming the file and key: {line!r}")
    except Exception as err:  # noqa: BLE001 - any other exception is a traceback at the CLI
        failures.append(f"{path.name}: {type(err).__name__}: {err}"[:400])
        line = ""
    if time.perf_counter() - start > 10:
        failures.append(f"{path.name}: took {time.perf_counter() - start:.1f} s")
    return line


def _generated(tmp_path: Path, base: dict, sections: tuple[str, ...], seed: int, count: int) -> list[str]:
    rng, failures, refused = random.Random(seed), [], 0
    for i in range(count):
        path = tmp_path / f"w{seed}_{i}.yaml"
        doc = mutate(rng, base, sections)
        path.write_text(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False))
        before = len(failures)
        refused += bool(check_input(path, failures))
        if len(failures) > before:
            failures[-1] += f"\n    input: {json.dumps(doc, default=repr)[:600]}"
    assert refused >= count // 2, f"only {refused} of {count} mutations were bad input: the generator lost its bite"
    return failures


@pytest.mark.parametrize(
    "base, sections, seed",
    [
        (MIX, ("buckets.0.mix",), 1),
        (MIX, ("variants", "buckets.0.variants"), 2),
        (MIX, ("buckets.0.arrival", "buckets.0.request_rates"), 3),
        (MIX, ("engine.admission",), 4),
        (SESSIONS, ("dataset",), 5),
        (SESSIONS, ("dataset", "buckets", "engine"), 6),
    ],
    ids=["mix", "variants", "arrival", "admission", "sessions", "sessions-buckets-engine"],
)
def test_200_generated_bad_sections_each_fail_in_one_line_naming_file_and_key(tmp_path, base, sections, seed):
    if sections == ("variants", "buckets.0.variants"):
        base = copy.deepcopy(base)
        base["buckets"][0]["variants"] = copy.deepcopy(base["variants"])
    failures = _generated(tmp_path, base, sections, seed, 200)
    assert not failures, "\n".join(failures[:20])


# ---- trace files (dataset: {kind: trace, path: ...}) -------------------------------------------
TRACE_WORKLOAD = {
    "name": "trace",
    "engine": {**ENGINE, "num_blocks": 256},
    "dataset": {"kind": "trace", "path": "trace.jsonl", "block_tokens": 4},
    "buckets": [{"name": "replay"}],
}
GOOD_LINE = {"timestamp": 0, "input_length": 8, "output_length": 4, "hash_ids": [0, 1]}
TRACE_JUNK: list[Any] = [
    None, True, -1, 0, -0.5, 1e308, math.inf, math.nan, 10**30, 2**64, "12", "", [], {}, [1, 2], "😀", 1.5,
]  # fmt: skip


def bad_trace(rng: random.Random) -> bytes:
    """A trace of a few good lines with something broken: a field missing or junk, timestamps out of
    order, hash_ids too few or not integers, a line that is no JSON object, BOM, CRLF, NUL, binary
    junk or nothing at all."""
    lines = [dict(GOOD_LINE, timestamp=10 * i) for i in range(rng.randint(2, 5))]
    kind = rng.randrange(9)
    row = rng.choice(lines)
    if kind == 0:
        row.pop(rng.choice(["timestamp", "input_length", "output_length"]))
    elif kind == 1:
        row[rng.choice(["timestamp", "input_length", "output_length", "hash_ids"])] = rng.choice(TRACE_JUNK)
    elif kind == 2:
        lines[-1]["timestamp"] = -1 if rng.random() < 0.3 else lines[0]["timestamp"] - rng.randint(1, 5)
        lines[0]["timestamp"] = max(lines[0]["timestamp"], 5)
    elif kind == 3:
        row["hash_ids"] = rng.choice([[0], [-1, 2], [0, "1"], [True, 1], [0.5, 1], [[0], 1], "0,1"])
    text = "\n".join(json.dumps(r, allow_nan=True) for r in lines) + "\n"
    if kind == 4:
        junk = rng.choice(["[1, 2]", '"text"', "{", "null", "{'a': 1}", "}{", "1e999", '{"timestamp": NaN}'])
        text = text.replace("\n", f"\n{junk}\n", 1)
    if kind == 5:
        text = "\ufeff" + text  # a byte-order mark before the first line
    data = text.encode()
    if kind == 6:
        data = data.replace(b"\n", b"\r\n") if rng.random() < 0.5 else data.replace(b"\n", b"\r")
        data += rng.choice([b"", b"\x00", b"{\r\n"])
    elif kind == 7:
        data = rng.choice([b"", b"\n\n  \n", b"\x00" * 8]) if rng.random() < 0.5 else rng.randbytes(64)
    elif kind == 8:
        data = data[: rng.randrange(1, len(data))]  # cut off mid-record
    return data


def test_250_generated_bad_trace_files_each_fail_in_one_line_naming_file_and_line(tmp_path):
    rng, failures, refused = random.Random(7), [], 0
    for i in range(250):
        folder = tmp_path / f"t{i}"
        folder.mkdir()
        (folder / "trace.jsonl").write_bytes(data := bad_trace(rng))
        path = folder / "w.yaml"
        path.write_text(yaml.safe_dump(TRACE_WORKLOAD))
        before = len(failures)
        refused += bool(check_input(path, failures, folder / "trace.jsonl"))
        if len(failures) > before:
            failures[-1] += f"\n    trace: {data[:300]!r}"
    assert refused >= 150, refused
    assert not failures, "\n".join(failures[:20])


# ---- what broke before, kept ---------------------------------------------------------------------
FOUND = [  # (base, YAML path, value, the start of the error after the file name)
    (SESSIONS, ("dataset", "sessions", "max_turns"), 10**30, "dataset.sessions.max_turns: must be <= 1000"),
    (SESSIONS, ("dataset", "sessions", "think_time_s"), 1e308, "dataset.sessions.think_time_s: must be at most"),
    (SESSIONS, ("dataset", "sessions", "think_time_s"), [0, 1e6], "dataset.sessions.think_time_s: must be at most"),
    (SESSIONS, ("buckets", 0, "input_tokens"), 10**30, "buckets[0].input_tokens.min: must be <= 16777216"),
    (SESSIONS, ("buckets", 0, "output_tokens", 1), 2**40, "buckets[0].output_tokens.max: must be <= 16777216"),
    (MIX, ("buckets", 0, "mix", 0, "input_tokens", 1), 2**62, "buckets[0].mix[0].input_tokens.max: must be <="),
    (MIX, ("buckets", 0, "arrival", "ramp_up_s"), 1e308, "buckets[0].arrival.ramp_up_s: must be <= 86400"),
    (MIX, ("buckets", 0, "arrival", "burstiness"), 1e-320, "buckets[0].arrival.burstiness: must be >= 1e-06"),
    (MIX, ("engine", "model"), "x\ny", "engine.model: must be one line of text"),
    (MIX, ("engine", "model"), " ", "engine.model: names no model"),
]


@pytest.mark.parametrize(
    "base, path, value, start", FOUND, ids=[f"{'.'.join(map(str, c[1]))}={c[2]!r}"[:60] for c in FOUND]
)
def test_inputs_that_once_crashed_simulate_are_one_line_at_validation(tmp_path, base, path, value, start):
    """Each of these passed validation and then, in ``kvplan simulate``, raised from numpy (int64
    overflow, a 765 GiB array, NaN to int), looped on arrivals at 1e308 s, or printed the model
    name's newline into the error: now refused where the workload is read, exit 2, one line."""
    doc = copy.deepcopy(base)
    _parent(doc, path)[path[-1]] = value
    (workload := tmp_path / "w.yaml").write_text(yaml.safe_dump(doc))
    code, out, err = run_cli("simulate", str(workload), "--out", str(tmp_path / "run"), "--quiet")
    assert code == 2 and "Traceback" not in err + out, err
    assert err.strip().count("\n") == 0 and err.startswith(f"error: {workload}: {start}"), err
