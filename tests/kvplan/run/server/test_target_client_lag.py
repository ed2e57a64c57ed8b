""" "Client behind" fires only when the client's own delay is a material share of what it measures:
the time-weighted loop lag P99 against 5 % of the level's TTFT P50, an open-loop send's delay
against a tenth of the mean inter-arrival time."""

import pytest
import yaml

from kvplan.results.run_result import load_run
from kvplan.run.server.client import BLOCK_ENV, LAG_TICK_S
from kvplan.run.server.client_lag import judge, stamp_delay_quantile
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.run.server.fake_server import FakeServer, Options
from tests.kvplan.run.server.test_target import workload


def test_a_stall_weighs_by_the_time_it_lasts():
    """190 ticks on time and one 50 ms late (tick 5 ms): the loop was stalled 50 of 1,005 ms. A
    chunk's stamp is late by more than x with probability (50 - x) / 1005, which is 1 % at
    x = 50 - 10.05 = 39.95 ms; a P99 over ticks would read 0. A steady 1 ms lag over 100 ticks:
    (1 - x) x 100 / 600 = 1 % at x = 0.94 ms."""
    stalled = [0.0] * 190 + [0.050]
    assert stamp_delay_quantile(stalled, 0.005) == pytest.approx(0.03995, abs=1e-9)
    assert stamp_delay_quantile([0.001] * 100, 0.005) == pytest.approx(0.00094, abs=1e-9)
    assert stamp_delay_quantile([0.00001] * 100, 0.005) == 0.0  # under 1 % of the time late at all
    assert stamp_delay_quantile([], 0.005) is None


def test_the_rule_judges_lag_against_ttft_and_sends_against_the_gap():
    assert judge(0.9, 100.0, None, None) == ""  # 0.9 ms of 100 ms: 0.9 %
    assert judge(5.1, 100.0, None, None) == "stamp delay P99 5.1 ms > 5% of TTFT P50 100 ms"
    assert judge(0.9, 100.0, 0.9, 10.0) == ""  # 0.9 ms late against 10 ms gaps (100 req/s)
    assert judge(0.9, 100.0, 1.1, 10.0) == "sends late by P99 1.1 ms > 0.1 x the mean gap 10 ms"
    assert judge(None, None, None, None) == "" and judge(3.0, None, None, None) == ""  # cannot be told


def run_c8(tmp_path, monkeypatch, block: str | None):
    """c=8 against a fake server with a 200 ms prefill and a chunk every 5 ms (64 requests of 16
    tokens: about 2.2 s), with the client's loop blocked as ``block`` says (or not)."""
    if block is None:
        monkeypatch.delenv(BLOCK_ENV, raising=False)
    else:
        monkeypatch.setenv(BLOCK_ENV, block)
    server = FakeServer(Options(interval_s=0.005, first_token_s=0.2)).start()
    try:
        path = workload(tmp_path)
        doc = yaml.safe_load(path.read_text())
        doc["buckets"][0].update({"concurrency": [8], "request_rates": [], "num_requests": 64, "output_tokens": 16})
        path.write_text(yaml.safe_dump(doc))
        run_dir = tmp_path / ("blocked" if block else "free")
        code, _, err = run_cli("loadtest", str(path), "--target", server.url, "--out", str(run_dir), "--quiet")
        assert code == 0, err
    finally:
        server.stop()
    result = load_run(run_dir).result
    (client,) = result.client
    return client, result.levels[0], (run_dir / "summary.md").read_text()


def test_a_fast_local_server_at_c8_is_not_behind_and_a_blocked_loop_is(tmp_path, monkeypatch):
    client, level, summary = run_c8(tmp_path, monkeypatch, None)
    assert level.num_completed == 64 and client.ttft_p50_ms == pytest.approx(level.ttft_ms.p50, rel=0.05)
    assert client.ttft_p50_ms > 200 and client.stamp_delay_p99_ms < 0.05 * client.ttft_p50_ms
    assert (client.behind, client.behind_reason) == (False, "")
    assert client.lag_p99_ms is not None and client.lag_max_ms is not None  # the raw lag is kept
    assert "| no |" in summary

    client, level, summary = run_c8(tmp_path, monkeypatch, "50/1000")
    assert level.num_completed == 64
    # at least one 50 ms stall in a level of ~2.2 s: over 2 % of the time, so the P99 is well above 10 ms
    assert client.lag_max_ms >= 45 and client.stamp_delay_p99_ms > 0.05 * client.ttft_p50_ms
    assert client.behind and client.behind_reason.startswith("stamp delay P99 ")
    assert "yes: stamp delay P99" in summary
    assert LAG_TICK_S == 0.005  # the tick the weighting assumes
