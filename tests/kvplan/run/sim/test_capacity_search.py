"""The capacity search at production scale: the knee by bisection equals the exhaustive scan, the
SLO answers are no longer capped by the bucket's request count, and the edge of each answer is
visible (the SLO holds at the answer and fails one search step above)."""

import json
from pathlib import Path

import pytest
import yaml

from kvplan.results.metrics import step_fields
from kvplan.run.sim import brackets, search
from kvplan.run.sim.calibration import store as calibrations
from kvplan.run.sim.cli_setup import setups_for
from kvplan.run.sim.run import sample
from kvplan.run.sim.search import Prober, knee_clock
from kvplan.workload.file import load_workload
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[4]
SMOKE = ROOT / "workloads" / "smoke.yaml"
CHAT = ROOT / "workloads" / "chat.yaml"


def _prober(path: Path, **gpu):
    workload = load_workload(path)
    setup, _, _ = setups_for(
        workload,
        calibrate=None,
        model=gpu.get("model"),
        gpu=gpu.get("gpu"),
        tp=1,
        kv_cache_dtype="auto",
        weight_dtype="auto",
        gpu_memory_utilization=None,
        replay=None,
        attainment=0.95,
    )
    return workload, setup, Prober(workload, setup.facts, knee_clock, sample(workload, setup.facts).requests)


def _levels_asked(monkeypatch) -> list[tuple[str, float]]:
    """(mode, level) of every level Prober simulates from now on, in order (Prober.level wrapped)."""
    asked: list[tuple[str, float]] = []
    level = Prober.level

    def counted(self, bucket_index, mode, value, *args, **kwargs):
        asked.append((mode, value))
        return level(self, bucket_index, mode, value, *args, **kwargs)

    monkeypatch.setattr(Prober, "level", counted)
    return asked


def _scan(prober: Prober, bucket_index: int) -> int | None:
    """The exhaustive scan: every concurrency from 1 to max_num_seqs, the first that preempts."""
    return next((c for c in range(1, prober.facts.max_num_seqs + 1) if prober.preempts(bucket_index, c)), None)


def test_the_knee_by_bisection_is_the_exhaustive_scans_on_the_tiny_model():
    _, _, prober = _prober(SMOKE)
    assert prober.knee(0) == _scan(prober, 0) == 8  # smoke.yaml: 4 always fit, 8 run out of blocks


@pytest.mark.smollm2
def test_the_knee_by_bisection_is_the_exhaustive_scans_on_chat_yaml():
    workload, _, prober = _prober(CHAT)
    knees = [prober.knee(i) for i in range(len(workload.buckets))]
    assert knees == [_scan(prober, i) for i in range(len(workload.buckets))] == [9, 2]


def test_a_larger_probe_changes_the_answers_by_less_than_the_search_precision(monkeypatch):
    """STEADY_ROUNDS measured requests per user against twice as many: the concurrency within the
    search's 2 % (or one user) and the rate within its 2 % (plus its 4-digit rounding)."""
    workload, setup, _ = _prober(SMOKE, model="llama-3.1-8b", gpu="H100-SXM")
    sampled = sample(workload, setup.facts).requests

    def answers():
        (capacity,) = search.search_capacity(workload, setup.facts, sampled, setup.clock, 0.95, {})
        return capacity.max_concurrency.level, capacity.max_request_rate.level

    c4, r4 = answers()
    monkeypatch.setattr(search, "STEADY_ROUNDS", 2 * search.STEADY_ROUNDS)
    c8, r8 = answers()
    assert c4 > setup.facts.max_num_seqs and abs(c8 - c4) <= max(1, 0.02 * c4)
    assert abs(r8 - r4) / r4 <= brackets.RATE_PRECISION - 1 + 1e-3


@pytest.mark.smollm2
def test_chat_yaml_on_an_h100_answers_above_the_buckets_48_requests_with_its_edge_visible(tmp_path):
    code, out, err = run_cli(
        "simulate", str(CHAT), "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--out", str(tmp_path / "r"), "--json"
    )
    assert code == 0, err
    short = json.loads(out)["buckets"][0]
    capacity = short["slo_capacity"]
    # the short bucket has 48 requests; the answer is where the SLO breaks, one search step apart
    best, above = capacity["max_concurrency"], capacity["above_concurrency"]
    assert short["slo_max_concurrency"] == best["level"] > 48
    assert best["level"] < above["level"] <= max(best["level"] * search.CONCURRENCY_PRECISION, best["level"] + 1)
    assert best["slo_attainment"] >= 0.95 > above["slo_attainment"]
    # the rate is finite: at most what max_num_seqs in flight serve, where the queue stops growing
    rate = capacity["max_request_rate"]
    assert capacity["burst_meets_slo"] is False and short["slo_max_request_rate"] == rate["level"]
    assert rate["slo_attainment"] >= 0.95 and rate["output_throughput_tok_s"] > 0 and rate["goodput_req_s"] > 0
    above_rate = capacity["above_request_rate"]
    assert capacity["request_rate_bound"] == "saturation" or above_rate["slo_attainment"] < 0.95


def test_the_queue_bound_is_predicted_by_littles_law_with_twice_the_room():
    """2 requests/s at max_num_seqs, 6 more users waiting: each adds 1 / 2 s, so 3,000 ms more
    than the 500 ms TTFT P95 there, 3,500 ms, which a 5,250 ms bound leaves 1.5 times over
    (QUEUE_MARGIN) and a 5,249 ms one does not; an E2E bound counts the same way, TPOT none."""
    from types import SimpleNamespace

    from kvplan.results.metrics import Slo

    stats = lambda p95: SimpleNamespace(p95=p95)  # noqa: E731
    at_top = SimpleNamespace(requests_per_s=2.0, ttft_ms=stats(500.0), e2e_ms=stats(4000.0))
    from kvplan.run.sim import edges

    cannot = edges.queue_cannot_bind
    assert edges.QUEUE_MARGIN == 1.5
    assert cannot(at_top, 6, Slo(ttft_ms=5250, tpot_ms=1))
    assert not cannot(at_top, 6, Slo(ttft_ms=5249))
    assert cannot(at_top, 6, Slo(ttft_ms=5250, e2e_ms=10500)) and not cannot(at_top, 6, Slo(e2e_ms=10499))
    assert not cannot(SimpleNamespace(requests_per_s=None, ttft_ms=None, e2e_ms=None), 6, Slo(ttft_ms=1e9))


def test_a_queue_that_cannot_bind_is_searched_at_its_limit_first_with_the_same_answers(monkeypatch):
    """smoke.yaml on an H100 under a TTFT bound of 1,000 s: every level up to 8 x max_num_seqs
    meets it. Probing that limit first answers it as doubling from max_num_seqs does, without the
    levels in between (16 -> 128 users: 32 and 64 not simulated)."""
    workload, setup, _ = _prober(SMOKE, model="llama-3.1-8b", gpu="H100-SXM")
    workload = workload.model_copy(update={"slo": workload.slo.model_copy(update={"ttft_ms": 1e6})})
    sampled = sample(workload, setup.facts).requests
    asked = _levels_asked(monkeypatch)
    closed = lambda: [v for m, v in asked if m == "closed"]  # noqa: E731
    (first,) = search.search_capacity(workload, setup.facts, sampled, setup.clock, 0.95, {})
    probed_first, asked[:] = closed(), []
    monkeypatch.setattr(search, "queue_cannot_bind", lambda *args: False)
    (doubled,) = search.search_capacity(workload, setup.facts, sampled, setup.clock, 0.95, {})
    probed_steered, asked[:] = closed(), []
    monkeypatch.setattr(search, "steered", lambda plain, ok, known, guess, **_: plain(ok))  # the plain searches
    (plain,) = search.search_capacity(workload, setup.facts, sampled, setup.clock, 0.95, {})
    top = setup.facts.max_num_seqs
    assert first == doubled == plain and first.max_concurrency.level == 8 * top
    assert first.concurrency_bound == "max_users"
    # the steered doubling goes to the limit too, where Little's law puts the edge (far past it)
    assert probed_first == probed_steered == [top, 8 * top] and closed() == [top, 2 * top, 4 * top, 8 * top]


@pytest.mark.parametrize("ttft_ms", [150.0, 170.0, 300.0, 500.0])
def test_the_saturation_rate_asked_first_gives_the_rate_searchs_answers(monkeypatch, tmp_path, ttft_ms):
    """smoke.yaml with outputs of 4-48 tokens on an H100 (max_num_seqs 16), where queues past 16
    users meet the TTFT bound (20, 22, 30 and 40 users). At 300 and 500 ms the saturation rate,
    asked first, meets it: the one rate simulated, where the search from the rate those users
    sustain asks two. At 170 ms it fails, and the search goes on from that rate as before (the same
    rates, saturation first). At 150 ms those users sustain the saturation rate itself: nothing
    changes. Every answer equals the search's without the saturation rate first."""
    doc = yaml.safe_load(SMOKE.read_text())
    doc["buckets"][0]["output_tokens"] = [4, 48]
    doc["engine"]["num_blocks"] = 4096
    doc["slo"]["ttft_ms"] = ttft_ms
    (path := tmp_path / "w.yaml").write_text(yaml.safe_dump(doc))
    workload, setup, _ = _prober(path, model="llama-3.1-8b", gpu="H100-SXM")
    sampled = sample(workload, setup.facts).requests
    levels = _levels_asked(monkeypatch)
    (first,) = search.search_capacity(workload, setup.facts, sampled, setup.clock, 0.95, {})
    asked, levels[:] = [v for m, v in levels if m == "open"], []
    plain_rate = brackets.highest_rate
    monkeypatch.setattr(search, "highest_rate", lambda ok, start, top, top_first: plain_rate(ok, start, top))
    (plain,) = search.search_capacity(workload, setup.facts, sampled, setup.clock, 0.95, {})
    rates = [v for m, v in levels if m == "open"]
    assert first == plain and first.max_concurrency.level > setup.facts.max_num_seqs
    saturation = max(rates)  # the search's top, which the plain one asks second (or first, at 150 ms)
    if ttft_ms >= 300.0:
        assert first.request_rate_bound == "saturation" and asked == [saturation] and len(rates) == 2
    elif ttft_ms == 170.0:
        assert first.request_rate_bound is None and asked == [saturation, *rates[:-1]] and rates[-1] == saturation
    else:
        assert asked == rates and rates[0] == saturation


@pytest.mark.smollm2
@pytest.mark.parametrize("gpu", [{}, {"model": "llama-3.1-8b", "gpu": "L4"}])
def test_the_steered_searches_give_the_plain_searches_answers_on_chat_yaml_with_fewer_levels(monkeypatch, gpu):
    """chat.yaml on its own engine (knees 9 and 2, max concurrency 15 and 2 with the Xeon's shipped
    calibration, pinned: the default is the machine's own, whose step times set the SLO answers) and
    on an L4 (the SLO past max_num_seqs): every answer, its edge and the levels' summaries equal the
    plain searches', from fewer simulated levels (brackets.steered)."""
    xeon = calibrations.load(calibrations.DATA_DIR / "smollm2-135m-bf16-cpu-xeon.json")
    monkeypatch.setattr(calibrations, "default_for", lambda workload: xeon)
    workload, setup, _ = _prober(CHAT, **gpu)
    sampled = sample(workload, setup.facts).requests
    counted = _levels_asked(monkeypatch)

    def answers():
        knees = search.simulated_knees(workload, setup.facts, sampled)
        found = search.search_capacity(workload, setup.facts, sampled, setup.clock, 0.95, knees)
        return knees, found, list(counted)

    steered = answers()
    counted[:] = []
    monkeypatch.setattr(search, "steered", lambda plain, ok, known, guess, **_: plain(ok))
    plain = answers()
    assert steered[:2] == plain[:2]
    assert len(steered[2]) < len(plain[2])
    if not gpu:
        assert steered[0] == {"short": 9, "long": 2}
        assert [b.max_concurrency.level for b in steered[1]] == [15, 2]


def test_a_probe_summary_leaves_out_only_the_itl_and_the_step_fields(monkeypatch):
    """A capacity probe's summary (``latencies_only``) equals the whole summary of the same
    records in every field the search reads and every other request field; only the ITL stats
    (None) and the step fields (as of no steps) are left out, and the whole one has them."""
    workload, setup, prober = _prober(SMOKE, model="llama-3.1-8b", gpu="H100-SXM")
    prober.clock = setup.clock
    asked = []
    summarize = search.summarize_level
    monkeypatch.setattr(search, "summarize_level", lambda *a, **k: asked.append((a, k)) or summarize(*a, **k))
    plan = prober.steady(4, 0)
    lean = prober.level(0, "closed", 4, variant=prober.slo_variant, plan=plan, decide=0.95)
    ((args, options),) = asked
    assert options == {"latencies_only": True}
    whole = summarize(*args)
    assert whole.itl_ms is not None and whole.num_steps > 0 and whole.peak_used_blocks > 0
    assert lean.itl_ms is None and lean.num_steps == 0 and lean.peak_used_blocks == 0
    steps = set(step_fields([]))
    assert lean.model_dump(exclude={"itl_ms", *steps}) == whole.model_dump(exclude={"itl_ms", *steps})
    assert lean.slo_attainment == whole.slo_attainment and lean.ttft_ms == whole.ttft_ms  # what the search reads
    # a level of a load test or `kvplan advise` (no decide, no stop at a preemption): the whole summary
    asked.clear()
    prober.level(0, "closed", 4)
    assert asked[0][1] == {"latencies_only": False}
