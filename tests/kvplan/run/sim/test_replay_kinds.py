"""`kvplan simulate W --replay RUN` on a measured run of every kind of workload kvplan ships (a
mix bucket without interference, engine variants, sessions, a trace, steady-state levels with a
warm-up and a cool-down): exit 0, or one line with exit 2, never a traceback. Where it exits 0,
the simulated levels are the measured ones (simulate adds the classes-alone levels of a mix, which
a load test without ``interference`` never ran: they are left out and said so).
"""

import json
from pathlib import Path

import pytest
import yaml

from tests.kvplan.cli_runner import run_cli

ENGINE = {
    "model": "tiny-random-llama",
    "dtype": "float32",
    "block_size": 4,
    "num_blocks": 24,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 24,
    "enable_prefix_caching": True,
}
SLO = {"ttft_ms": 500, "tpot_ms": 100}
PLAIN = {"input_tokens": [6, 20], "output_tokens": [3, 8], "concurrency": [2, 4], "num_requests": 6}

KINDS = {
    "mix": {
        "buckets": [
            {
                "name": "support",
                "mix": [
                    {"name": "chat", "weight": 0.75, "input_tokens": [4, 10], "output_tokens": [3, 6]},
                    {"name": "doc", "weight": 0.25, "input_tokens": [20, 30], "output_tokens": [2, 4]},
                ],
                "concurrency": [4],
                "request_rates": [100],
                "num_requests": 8,
            }
        ]
    },
    "variants": {
        "buckets": [{"name": "chat", **PLAIN}],
        "variants": [
            {"name": "small-steps", "engine": {"max_num_batched_tokens": 8}},
            {"name": "big-steps", "engine": {"max_num_batched_tokens": 64}},
        ],
    },
    "sessions": {
        "dataset": {"kind": "random", "sessions": {"max_turns": 3, "think_time_s": [0.0, 0.01]}},
        "buckets": [{"name": "chat", **PLAIN, "request_rates": [50]}],
    },
    "trace": {
        "dataset": {"kind": "trace", "path": "trace.jsonl", "max_input_tokens": 40, "max_output_tokens": 6},
        "buckets": [{"name": "conversation"}],
    },
    "steady": {
        "buckets": [{"name": "chat", **PLAIN, "warmup": 2, "cooldown": 2, "request_rates": [200]}],
    },
}


def write_workload(folder: Path, kind: str) -> Path:
    if kind == "trace":  # Mooncake's format: 8 requests over 0.1 s, the first block shared by half
        lines = [
            {"timestamp": 12 * i, "input_length": 20 + i, "output_length": 4, "hash_ids": [0 if i % 2 else 100 + i, i]}
            for i in range(8)
        ]
        (folder / "trace.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = {"name": f"replay-{kind}", "seed": 0, "engine": ENGINE, "dataset": "random", "slo": SLO, **KINDS[kind]}
    path = folder / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_replay_of_every_workload_kind_exits_0_or_one_line(kind, tmp_path):
    workload = write_workload(tmp_path, kind)
    code, out, err = run_cli("loadtest", str(workload), "--out", str(tmp_path / "measured"), "--quiet")
    assert code == 0, err
    code, out, err = run_cli(
        "simulate", str(workload), "--replay", str(tmp_path / "measured"), "--out", str(tmp_path / "sim"), "--json"
    )
    assert "Traceback" not in out + err
    if code:
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        return
    measured = json.loads((tmp_path / "measured" / "results.json").read_text())
    simulated = json.loads((tmp_path / "sim" / "results.json").read_text())
    ids = [(lv["bucket"], lv["mode"], lv["level"], lv.get("variant")) for lv in measured["levels"]]
    assert [(lv["bucket"], lv["mode"], lv["level"], lv.get("variant")) for lv in simulated["levels"]] == ids
    assert [lv["num_completed"] for lv in simulated["levels"]] == [lv["num_completed"] for lv in measured["levels"]]
    if kind == "mix":  # simulate would add each class alone; the measured run has none of them
        assert not any("alone" in (lv.get("variant") or "") for lv in measured["levels"])
        assert "not simulated, as the measured run did not run them" in " ".join((out + err).split())
