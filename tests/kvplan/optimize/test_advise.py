"""``kvplan advise``: each alternative is the simulation of the workload with that one setting
changed (checked against ``kvplan simulate`` of the edited workload), and the verdicts follow the
documented rule (hand-made outcomes)."""

import json
from pathlib import Path

import pytest
import yaml

from kvplan.optimize.advise import Alternative, BucketAdvice, alternatives, verdict
from kvplan.results.run_result import read_result
from kvplan.workload.file import load_workload, parse_workload
from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "workloads" / "smoke.yaml"


def bucket(users=None, rate=None, goodput=None, rps=None, hit=None):
    return BucketAdvice(
        name="b",
        max_users=users,
        max_request_rate=rate,
        goodput_at_max=None,
        level="c=8",
        goodput=goodput,
        requests_per_s=rps,
        ttft_p50_ms=None,
        prefix_hit_rate=hit,
    )


def test_the_verdict_compares_the_first_answer_both_have_and_inverts_a_removed_optimisation():
    seqs = Alternative("max_num_seqs 32", "", {"max_num_seqs": 32})
    assert verdict(seqs, [bucket(users=100)], [bucket(users=106)])[0] == "worth it"  # +6 % > 5 %
    assert verdict(seqs, [bucket(users=100)], [bucket(users=104)])[0] == "within noise"
    assert verdict(seqs, [bucket(users=100)], [bucket(users=90)])[0] == "not worth it"
    # no capacity answer on either side: goodput at the top level, then request throughput
    said, why = verdict(seqs, [bucket(goodput=0.0, rps=1.0)], [bucket(goodput=0.0, rps=2.0)])
    assert said == "worth it" and "req/s at c=8 1 -> 2 (+100%)" in why
    # the mean over buckets decides: +20 % and -10 % average +5 %, not above the noise
    assert verdict(seqs, [bucket(users=100), bucket(users=100)], [bucket(users=120), bucket(users=90)])[0] == (
        "within noise"
    )
    # prefix caching already on, simulated off: losing 50 % means the optimisation pays
    off = Alternative("prefix caching", "", {"enable_prefix_caching": False}, removes=True)
    said, why = verdict(off, [bucket(users=100, hit=0.4)], [bucket(users=50, hit=0.0)])
    assert said == "worth it" and "prefix hit rate 40.0% with it" in why
    # both capacity answers count; a one-user difference is the search's resolution; a ceiling is no edge
    both = verdict(seqs, [bucket(users=2, rate=10.0)], [bucket(users=3, rate=5.0)])
    assert both[0] == "not worth it" and "max users 2 -> 3 (+0%)" in both[1] and "max req/s 10 -> 5 (-50%)" in both[1]
    capped = BucketAdvice(**{**bucket(users=128, rate=10.0).model_dump(), "max_users_bound": True})
    said, why = verdict(seqs, [capped], [bucket(users=256, rate=10.0)])
    assert said == "within noise" and "max users" not in why
    # prefix caching off, simulated on, with nothing to reuse: not worth it whatever else moved
    on = Alternative("prefix caching", "", {"enable_prefix_caching": True})
    assert verdict(on, [bucket(users=100)], [bucket(users=120, hit=0.001)])[0] == "not worth it"


def test_the_alternatives_are_one_change_each_keeping_the_pool_in_bytes():
    workload = load_workload(SMOKE)  # block size 4, 48 blocks, 16 seqs, budget 256, caching off
    found = {a.name: a.engine for a in alternatives(workload, on_gpu=False, kv_cache_dtype="auto")}
    assert found == {
        "prefix caching": {"enable_prefix_caching": True},
        "fp8 KV cache": {"kv_cache_dtype": "fp8"},
        "step budget 128": {"max_num_batched_tokens": 128},
        "step budget 512": {"max_num_batched_tokens": 512},
        "max_num_seqs 8": {"max_num_seqs": 8},
        "max_num_seqs 32": {"max_num_seqs": 32},
        "block size 32": {"block_size": 32, "num_blocks": 6},  # 48 x 4 = 6 x 32 tokens
        "disaggregation": {"disagg": {"prefill": {"workers": 1}, "decode": {"workers": 1}}},
    }
    gpu = {a.name: a for a in alternatives(workload, on_gpu=True, kv_cache_dtype="fp8")}
    assert gpu["fp8 KV cache"].removes and gpu["fp8 KV cache"].kv_cache_dtype == "bf16"
    assert "disaggregation" not in gpu  # a GPU deployment's split is kvplan plan --disagg's question
    split = parse_workload(
        {**workload.model_dump(mode="json"), "engine": {**workload.model_dump(mode="json")["engine"], "disagg": {}}}
    )
    (back,) = [a for a in alternatives(split, on_gpu=False, kv_cache_dtype="auto") if a.name == "disaggregation"]
    assert back.removes and back.engine == {"disagg": None}


def test_an_alternative_is_the_simulation_of_the_workload_with_that_setting(tmp_path):
    code, out, err = run_cli("advise", str(SMOKE), "--json")
    assert code == 0, err
    rows = {a["name"]: a for a in json.loads(out)["alternatives"]}
    assert rows["as it is"]["verdict"] == "baseline"
    assert rows["fp8 KV cache"]["verdict"] == "cannot run"  # no fp8 calibration ships for the tiny model
    assert rows["prefix caching"]["verdict"] == "not worth it" and "no prefix reuse" in rows["prefix caching"]["reason"]
    split = {"disagg": {"prefill": {"workers": 1}, "decode": {"workers": 1}}}  # 1 + 1 workers, host-memcpy
    for i, (name, engine) in enumerate(
        (("as it is", {}), ("max_num_seqs 8", {"max_num_seqs": 8}), ("disaggregation", split))
    ):
        data = load_workload(SMOKE).model_dump(mode="json")
        data["engine"].update(engine)
        data["plan"] = []
        path = tmp_path / f"{i}.yaml"

        path.write_text(yaml.safe_dump(data))
        parse_workload(data)  # the edited workload is valid
        code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / f"run{i}"), "--quiet")
        assert code == 0, err
        result = read_result(tmp_path / f"run{i}")
        cap = result.capacity[0].buckets[0]
        mine = rows[name]["buckets"][0]
        assert mine["max_users"] == cap.max_concurrency.level
        assert mine["max_request_rate"] == (cap.max_request_rate.level if cap.max_request_rate else None)
        top = next(lv for lv in result.levels if lv.mode == "closed" and lv.level == 8)
        assert mine["goodput"] == pytest.approx(top.goodput_rps) and mine["ttft_p50_ms"] == pytest.approx(
            top.ttft_ms.p50
        )
        assert rows[name]["pool_tokens"] == result.engine.num_blocks * result.engine.block_size


def test_prefix_caching_pays_on_shared_prefixes_and_not_without_reuse():
    code, out, err = run_cli("advise", str(ROOT / "workloads" / "shared_prefix.yaml"), "--json")
    assert code == 0, err
    row = next(a for a in json.loads(out)["alternatives"] if a["name"] == "prefix caching")
    assert row["verdict"] == "worth it" and "prefix hit rate" in row["reason"]
    code, out, err = run_cli(
        "advise", str(ROOT / "workloads" / "chat.yaml"), "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--json"
    )
    assert code == 0, err
    row = next(a for a in json.loads(out)["alternatives"] if a["name"] == "prefix caching")
    assert row["verdict"] == "not worth it" and "no prefix reuse: 0.0%" in row["reason"]
    assert all(b["max_users"] for b in row["buckets"])  # capacity answers on the GPU


def test_bad_options_are_one_line():
    code, out, err = run_cli("advise", str(SMOKE), "--gpu", "H100-SXM")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "model" in err


def test_fp8_quality_measures_the_condition_on_the_bundled_engine():
    from kvplan.run.bundled.backend import build_engine
    from kvplan.run.bundled.fp8_quality import check_for_run
    from kvplan.traffic.prompts import sample_buckets

    code, out, err = run_cli("advise", str(SMOKE), "--fp8-quality", "--json")
    assert code == 0, err
    row = next(a for a in json.loads(out)["alternatives"] if a["name"] == "fp8 KV cache")
    workload = load_workload(SMOKE)
    engine = build_engine(workload)
    q = check_for_run(engine, workload, sample_buckets(workload, None, engine.hf_config.vocab_size).requests)
    assert (
        f"measured on tiny-random-llama: top-1 agreement {q.top1_agreement:.1%}, mean KL {q.mean_kl:.3g}"
        in (row["condition"])
    )
    code, _, err = run_cli("advise", str(SMOKE), "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--fp8-quality")
    assert code == 2 and "--fp8-quality: runs on the bundled engine" in err


def test_advise_says_a_workloads_variants_are_not_used(tmp_path):
    data = yaml.safe_load(SMOKE.read_text())
    data["variants"] = [
        {"name": "small", "engine": {"max_num_seqs": 2}},
        {"name": "big", "engine": {"max_num_seqs": 8}},
    ]
    path = tmp_path / "variants.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, err = run_cli("advise", str(path), "--json")
    assert code == 0, err
    assert err.splitlines()[0] == (
        f"warning: {path}: variants: kvplan advise judges the engine section alone;"
        " the workload's variants are not used"
    )
    assert json.loads(out)["alternatives"]  # the advice itself is the engine section's, as without variants
