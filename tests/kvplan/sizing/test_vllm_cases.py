"""Every case of tests/kvplan/data/vllm_kv_logs.yaml through `kvplan estimate --json`.

The cases are public vLLM start-up logs (each with its source), copied from
../shared/cases/vllm_kv_logs.yaml so that a clean clone runs them.

vLLM prints GiB with 2 decimals, so a printed ``available_kv_cache_gib`` X stands for any pool in
[X - 0.005, X + 0.005] GiB: running the CLI at both ends brackets the token count (and the
estimated max model len) that vLLM must have printed. Max concurrency is checked at the pool that
holds exactly the printed token count. Each case runs twice: with a config.json written from the
case's own numbers, and with the bundled preset of the same Hugging Face id where there is one.
"""

import json
import sys
from pathlib import Path

import pytest
import yaml

from kvplan.cli import main
from kvplan.errors import KvplanError
from kvplan.sizing.models.model_source import load_model_spec

GiB = 2**30
CASES_FILE = Path(__file__).resolve().parents[1] / "data" / "vllm_kv_logs.yaml"
CASES = yaml.safe_load(CASES_FILE.read_text())["cases"]
# Case model keys -> config.json keys.
HF_KEYS = {
    "layers": "num_hidden_layers",
    "attention_heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "hidden_size": "hidden_size",
    "head_dim": "head_dim",
    "kv_lora_rank": "kv_lora_rank",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "v_head_dim": "v_head_dim",
}


def has_preset(name: str) -> bool:
    try:
        load_model_spec(name)
    except KvplanError:
        return False
    return True


PARAMS = [pytest.param(case, "numbers", id=f"{case['id']}-numbers") for case in CASES] + [
    pytest.param(case, "preset", id=f"{case['id']}-preset") for case in CASES if has_preset(case["model"]["name"])
]


def estimate(monkeypatch, capsys, model: str, settings: dict, *extra: str, max_model_len=None) -> dict:
    args = ["kvplan", "estimate", "--model", model, "--json", *extra]
    args += ["--tp", str(settings.get("tensor_parallel_size", 1)), "--block-size", str(settings["block_size"])]
    args += ["--kv-cache-dtype", settings["kv_cache_dtype"]]
    if max_model_len or settings.get("max_model_len"):
        args += ["--max-model-len", str(max_model_len or settings["max_model_len"])]
    monkeypatch.setattr(sys, "argv", args)
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0, err
    return json.loads(out)


def model_arg(case: dict, source: str, tmp_path: Path) -> str:
    if source == "preset":
        return case["model"]["name"]
    config = {HF_KEYS[k]: v for k, v in case["model"].items() if k in HF_KEYS}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path / "config.json")


def check_pool(monkeypatch, capsys, model, settings, reported, max_model_len=None):
    """Tokens, blocks and estimated max model len bracketed by the printed pool size +-0.005 GiB."""
    pool_gib = reported.get("available_kv_cache_gib", reported.get("kv_cache_size_gib"))
    low, high = (
        estimate(
            monkeypatch, capsys, model, settings, "--kv-memory-gib", str(pool_gib + d), max_model_len=max_model_len
        )
        for d in (-0.005, 0.005)
    )
    block = settings["block_size"]
    tokens = reported.get("gpu_kv_cache_tokens") or (reported.get("num_gpu_blocks", 0) * block) or None
    if tokens:
        assert low["kv_capacity_tokens"] <= tokens <= high["kv_capacity_tokens"]
    if "num_gpu_blocks" in reported:
        assert low["num_blocks"] <= reported["num_gpu_blocks"] <= high["num_blocks"]
    if "estimated_max_model_len" in reported:
        assert low["max_model_len_fit"] <= reported["estimated_max_model_len"] <= high["max_model_len_fit"]
    return low


@pytest.mark.parametrize("case, source", PARAMS)
def test_vllm_case(monkeypatch, capsys, tmp_path, case, source):
    model = model_arg(case, source, tmp_path)
    settings, reported = case["settings"], case["reported"]
    block = settings["block_size"]

    if "available_kv_cache_gib" in reported or "kv_cache_size_gib" in reported:
        low = check_pool(monkeypatch, capsys, model, settings, reported)
        needed = reported.get("kv_needed_gib", reported.get("kv_needed_for_one_max_len_request_gib"))
        if needed is not None:
            assert abs(low["per_request_bytes"] / GiB - needed) <= 0.005
            if reported["available_kv_cache_gib"] < needed:  # vLLM refused: one request does not fit
                assert low["max_model_len_fit"] is not None and low["max_model_len_fit"] % block == 0

    if "max_concurrency" in reported:
        tokens = reported.get("gpu_kv_cache_tokens") or reported["num_gpu_blocks"] * block
        probe = estimate(monkeypatch, capsys, model, settings)
        # a pool of exactly the printed tokens, plus half a block so float rounding cannot lose one
        pool_gib = (tokens * probe["bytes_per_token"] + probe["bytes_per_block"] // 2) / GiB
        exact = estimate(monkeypatch, capsys, model, settings, "--kv-memory-gib", repr(pool_gib))
        assert exact["kv_capacity_tokens"] == tokens
        assert round(exact["max_concurrency"], 2) == reported["max_concurrency"]

    if "weights_gib" in reported:  # the budget line: total x utilization - weights - activations - non-torch
        overhead = reported["activation_peak_gib"] + reported["non_torch_gib"]
        result = estimate(
            monkeypatch,
            capsys,
            model,
            settings,
            "--gpu-memory-gib",
            str(settings["gpu_memory_gib"]),
            "--gpu-memory-utilization",
            str(settings["gpu_memory_utilization"]),
            "--weights-gib",
            str(reported["weights_gib"]),
            "--overhead-gib",
            str(overhead),
        )
        # four printed terms of +-0.005 GiB each (total scaled by the utilization), and the printed pool's own
        assert abs(result["kv_budget_bytes"] / GiB - reported["available_kv_cache_gib"]) <= 0.005 + 0.02
        assert abs(result["num_blocks"] - reported["num_gpu_blocks"]) <= 1

    if "second_run" in case:
        second = case["second_run"]
        check_pool(monkeypatch, capsys, model, settings, second, max_model_len=second["max_model_len"])
        result = estimate(monkeypatch, capsys, model, settings, max_model_len=second["max_model_len"])
        assert abs(result["per_request_bytes"] / GiB - second["kv_needed_gib"]) <= 0.005
