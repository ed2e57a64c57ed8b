"""A trace bucket's knee and SLO search probes run an evenly spaced sample of at most 1,000 of its
requests (kvplan.run.sim.trace_sample): on a 2,500-request trace they give exactly the answers of
the same search on a trace file holding only the sampled lines (positions j x 2500 // 1000, worked
here by hand), the replay level still runs all 2,500, and ``kvplan simulate`` says it sampled."""

import json
from pathlib import Path

import pytest

from kvplan.results.run_result import load_run
from kvplan.run.sim.run import sample
from kvplan.run.sim.search import search_capacity, simulated_knees
from kvplan.run.sim.setups import engine_setup
from kvplan.run.sim.trace_sample import evenly_spaced, probe_sample
from kvplan.workload.file import load_workload
from kvplan.workload.trace import PROBE_REQUESTS
from tests.kvplan.cli_runner import run_cli

N = 2500
BLOCK = 16
# block 4 x 96 blocks: the shipped calibration of tiny-random-llama; a small pool so the knee is found
ENGINE = {"model": "tiny-random-llama", "dtype": "float32", "block_size": 4, "num_blocks": 96, "max_num_seqs": 16}


def _line(k: int) -> dict:
    """Line k: 8-40 tokens in, 2-6 out, its own hash ids (so its tokens are the same in any file)."""
    inputs = 8 + k * 7 % 33
    ids = [2 * k + b for b in range(-(-inputs // BLOCK))]
    return {"timestamp": k * 40, "input_length": inputs, "output_length": 2 + k % 5, "hash_ids": ids}


def _workload(folder: Path, name: str, lines: list[dict]) -> Path:
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    doc = {
        "name": name,
        "seed": 3,
        "engine": ENGINE,
        "dataset": {"kind": "trace", "path": f"{name}.jsonl", "block_tokens": BLOCK},
        "slo": {"ttft_ms": 40, "tpot_ms": 8},
        "buckets": [{"name": "t"}],
    }
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(doc))
    return path


def test_evenly_spaced_by_hand():
    assert evenly_spaced(10, 4) == [0, 2, 5, 7] and evenly_spaced(3, 4) == [0, 1, 2]
    assert evenly_spaced(N, PROBE_REQUESTS)[:6] == [0, 2, 5, 7, 10, 12] and PROBE_REQUESTS == 1000


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("probe")
    lines = [_line(k) for k in range(N)]
    picked = [j * N // 1000 for j in range(1000)]  # by hand: floor(2.5 j)
    full = load_workload(_workload(folder, "full", lines))
    alone = load_workload(_workload(folder, "alone", [lines[i] for i in picked]))
    return folder, full, alone, picked


def test_the_probes_answer_as_the_sampled_lines_alone(traces):
    _, full, alone, picked = traces
    setup = engine_setup(full)[0]
    sampled, own = sample(full, setup.facts), sample(alone, setup.facts)
    assert len(sampled.requests["t"]) == N and sampled.dataset_info["probe_requests"] == 1000
    cut_workload, cut = probe_sample(full, sampled.requests)
    assert [r.source for r in cut["t"]] == [f"trace:{i + 1}" for i in picked]
    assert cut_workload.buckets[0].num_requests == 1000
    assert [r.prompt_token_ids for r in cut["t"]] == [r.prompt_token_ids for r in own.requests["t"]]
    knees = simulated_knees(full, setup.facts, sampled.requests)
    assert knees == simulated_knees(alone, setup.facts, own.requests) and knees["t"] is not None
    answers = search_capacity(full, setup.facts, sampled.requests, setup.clock, 0.9, knees)
    assert answers == search_capacity(alone, setup.facts, own.requests, setup.clock, 0.9, knees)
    assert answers[0].max_concurrency is not None


def test_simulate_replays_every_request_and_says_it_sampled(traces):
    folder = traces[0]
    code, out, err = run_cli("simulate", str(folder / "full.yaml"), "--quiet", "--out", str(folder / "run"))
    assert code == 0, err
    assert "the knee and the SLO search run a sample of 1,000 of its 2,500 requests, evenly spaced" in err
    run = load_run(folder / "run")
    (level,) = run.result.levels
    assert level.num_completed == N and len(run.requests) == N
    assert run.result.run.dataset["probe_requests"] == 1000 and run.result.capacity


def test_plan_jobs_search_on_every_request_they_are_given(traces, monkeypatch):
    """``kvplan plan`` judges exactly its job's requests (a window's --window-requests): unsampled."""
    import kvplan.run.sim.search as search

    _, full, _, _ = traces
    setup = engine_setup(full)[0]
    sampled = sample(full, setup.facts).requests
    seen = []
    real = search.Prober.__init__

    def spy(self, workload, facts, clock, requests, make_backend=None, ahead=False):
        seen.append((workload.buckets[0].num_requests, len(requests["t"])))
        real(self, workload, facts, clock, requests, make_backend, ahead)

    monkeypatch.setattr(search.Prober, "__init__", spy)
    search_capacity(full, setup.facts, sampled, setup.clock, 0.9, {}, trace_sample=False)
    search_capacity(full, setup.facts, sampled, setup.clock, 0.9, {})
    assert seen == [(N, N), (1000, 1000)]
    source = (Path(search.__file__).parents[2] / "optimize" / "plan.py").read_text()
    assert "trace_sample=False" in source
