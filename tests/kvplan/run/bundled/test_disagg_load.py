"""A workload's ``engine.disagg``: ``kvplan loadtest`` runs the bundled engine disaggregated in
process (engine.disagg.inproc.DisaggEngine) with the aggregated engine's greedy tokens and each
request's measured KV copy in requests.csv; ``kvplan simulate`` runs the same pools on the
simulator's two schedulers with each transfer priced over the named link; bad settings are one
line, exit 2."""

import csv
import math

import pytest
import yaml

from kvplan.results.run_result import load_run
from kvplan.run.bundled.backend import build_engine
from kvplan.run.loadtest import run_loadtest
from kvplan.workload.file import parse_workload
from tests.engine.test_disagg import assert_no_blocks_held
from tests.kvplan.cli_runner import run_cli

# tiny-random-llama fp32: 2 layers x (K, V) x 2 KV heads x head_dim 16 x 4 bytes = 512 bytes a token
BYTES_PER_BLOCK = 4 * 512  # block_size 4
LINK_GBPS, LINK_SETUP_US = 0.001, 100.0  # 10**6 bytes/s: a 5-block prompt moves in 100 us + 10.24 ms
DISAGG = (
    "prefill: {workers: 1, max_num_batched_tokens: 32}, decode: {workers: 1, num_blocks: 40},"
    f" link: {{gbps: {LINK_GBPS}, setup_us: {LINK_SETUP_US}}}"
)
WORKLOAD = f"""name: dis
seed: 0
engine: {{model: tiny-random-llama, dtype: float32, block_size: 4, num_blocks: 48, max_num_seqs: 8,
         max_num_batched_tokens: 64, enable_prefix_caching: false, disagg: {{{DISAGG}}}}}
dataset: random
buckets: [{{name: short, input_tokens: [9, 20], output_tokens: 6, concurrency: [1, 4], num_requests: 6}}]
"""


def workload(text: str = WORKLOAD, **engine):
    data = yaml.safe_load(text)
    data["engine"] |= engine
    return parse_workload(data)


def tokens_by_request(run, w):
    """Run ``w`` through run_loadtest on its engine, keeping every finished request's output token ids."""
    engine = build_engine(w)
    step, seen = engine.step, {}

    def spying():
        result = step()
        outputs = result if isinstance(result, list) else result[0]  # DisaggEngine.step: outputs only
        seen.update((o.request_id, o.output_token_ids) for o in outputs if "/" in o.request_id)
        return result

    engine.step = spying
    return load_run(run_loadtest(w, run, engine=engine)), seen, engine


def test_loadtest_disaggregated_gives_the_aggregated_tokens_and_times_each_transfer(tmp_path):
    dis, dis_tokens, engine = tokens_by_request(tmp_path / "dis", workload())
    agg, agg_tokens, _ = tokens_by_request(tmp_path / "agg", workload(disagg=None))
    assert dis.result.status == agg.result.status == "complete"
    assert len(dis_tokens) == 12 and dis_tokens == agg_tokens  # 2 levels x 6 requests, same greedy tokens
    assert all(len(t) == 6 for t in dis_tokens.values())
    assert_no_blocks_held(engine)
    # facts the fit checks read: the smaller pool (decode's 40 blocks), decode's max_num_seqs x 1 worker
    assert (dis.result.engine.num_blocks, dis.result.engine.max_num_seqs) == (40, 8)
    with open(dis.run_dir / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and all(float(r["kv_transfer_s"]) > 0 for r in rows)
    assert all(r.kv_transfer_s is None for r in agg.requests)
    # every block that left the prefill worker arrived: ceil(prompt / 4) blocks of each request
    blocks = sum(math.ceil(r.num_prompt_tokens / 4) for r in dis.requests) + 1  # + the warm-up's 1-token prompt
    assert engine.decode[0].num_imported_blocks == engine.prefill[0].num_exported_blocks == blocks


def test_simulate_runs_the_pools_and_prices_each_transfer_over_the_link(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD)
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "sim"), "--quiet")
    assert (code, err) == (0, ""), err
    run = load_run(tmp_path / "sim")
    assert run.result.status == "complete" and len(run.requests) == 12
    assert all(r.num_output_tokens == 6 and r.finish_reason == "length" for r in run.requests)
    assert "1P + 1D over" in run.result.cost_model.description
    # one request in flight: its transfer has the link alone, setup + bytes / bandwidth
    alone = [r for r in run.requests if r.key.mode == "closed" and r.key.value == 1]
    assert len(alone) == 6
    for r in alone:
        moved = math.ceil(r.num_prompt_tokens / 4) * BYTES_PER_BLOCK
        assert r.kv_transfer_s == pytest.approx(LINK_SETUP_US * 1e-6 + moved / (LINK_GBPS * 1e9))


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ("prefill: {workers: 0}", "engine.disagg.prefill.workers: must be >= 1 (got 0)"),
        ("decode: {workers: 1, max_seqs: 4}", "engine.disagg.decode.max_seqs: unknown field"),
        ("decode: {num_blocks: 8, kv_cache_memory: 1MiB}", "engine.disagg.decode: give kv_cache_memory or num_blocks"),
        ("link: pcie9", "engine.disagg.link: unknown link 'pcie9'"),
    ],
)
@pytest.mark.parametrize("command", ["loadtest", "simulate"])
def test_bad_disagg_settings_are_one_line_and_exit_2(tmp_path, command, change, line):
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD.replace(DISAGG, change))
    code, out, err = run_cli(command, str(path), "--out", str(tmp_path / "run"))
    assert code == 2 and line in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        ("\nvariants: [{name: a, engine: {max_num_seqs: 2}}]", "variants: are not supported with engine.disagg"),
        ("", "engine: disagg: admission is not supported with a disaggregated engine"),
    ],
)
def test_what_disagg_does_not_support_is_one_line(tmp_path, extra, line):
    text = WORKLOAD + extra
    if not extra:
        text = text.replace(
            "enable_prefix_caching: false,", "enable_prefix_caching: false, admission: {max_num_waiting: 2},"
        )
    path = tmp_path / "w.yaml"
    path.write_text(text)
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "run"))
    assert code == 2 and line in err and len(err.strip().splitlines()) == 1, err
