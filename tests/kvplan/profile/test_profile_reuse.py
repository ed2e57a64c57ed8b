"""`kvplan profile --reuse-distance` on a handmade Mooncake log, its distances counted by hand."""

from __future__ import annotations

import json
import random
from pathlib import Path

import kvplan.profile.stream as stream
from kvplan.profile.stream import profile_stream
from kvplan.sizing.reuse_distance import TIER_TOKENS
from tests.kvplan.cli_runner import run_cli

# (ms, hash ids): units A=(1), B=(1,2), C=(3), D=(1,2,4), E=(1,5), 512 tokens each
LINES = [(0, [1, 2]), (1000, [3]), (2000, [1, 2, 4]), (5000, [3]), (6000, [1, 5])]


def write_log(path: Path, lines=LINES) -> Path:
    rows = [{"timestamp": ms, "input_length": 512 * len(ids), "output_length": 8, "hash_ids": ids} for ms, ids in lines]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_distances_of_a_handmade_log(tmp_path):
    # references A B | C | A B D | C | A E: A at 3 has B C between (1024 tokens, 2 s after request 0);
    # B at 4 has C A (1024, 2 s); C at 6 has A B D (1536, 5 - 1 = 4 s); A at 7 has B D C (1536, 6 - 2 = 4 s)
    data = profile_stream(write_log(tmp_path / "log.jsonl"), reuse_distance=True).data
    reuse = data["reuse_distance"]
    assert reuse["num_references"] == 9 and reuse["num_reuses"] == 4
    assert reuse["tokens"] == {"p50": 1280.0, "p90": 1536.0, "p99": 1536.0, "max": 1536.0}
    assert reuse["seconds"] == {"p50": 3.0, "p90": 4.0, "p99": 4.0, "max": 4.0}
    # the smallest cache reported, 4,096 tokens (8 units), holds all 5 distinct units: every reuse hits
    assert reuse["lru_hits"][0] == {"tokens": 4096, "hit_share": 1.0}
    assert [h["tokens"] for h in reuse["lru_hits"]] == list(TIER_TOKENS)
    assert "reuse_distance" not in profile_stream(tmp_path / "log.jsonl").data


def test_read_out_of_order_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "BATCH", 1)  # held back one chain: a log out of order is read again
    lines = LINES[:]
    random.Random(1).shuffle(lines)
    assert lines != LINES
    again = profile_stream(write_log(tmp_path / "shuffled.jsonl", lines), reuse_distance=True).data
    assert (
        again["reuse_distance"]
        == profile_stream(write_log(tmp_path / "log.jsonl"), reuse_distance=True).data["reuse_distance"]
    )


def test_the_cli_json_and_tables(tmp_path):
    log = write_log(tmp_path / "log.jsonl")
    code, out, _ = run_cli("profile", str(log), "--json")
    assert code == 0 and json.loads(out)["reuse_distance"] is None
    code, out, _ = run_cli("profile", str(log), "--json", "--reuse-distance")
    assert code == 0 and json.loads(out)["reuse_distance"]["tokens"]["p50"] == 1280.0
    code, out, _ = run_cli("profile", str(log), "--reuse-distance")
    assert code == 0 and "reuses: 4 of 9 prefix-block references" in out and "4,096" in out
    code, _, err = run_cli("profile", str(log), "--reuse-distance", "--replay", "--out", str(tmp_path / "w.yaml"))
    assert code == 2 and "error: --reuse-distance:" in err and "Traceback" not in err
