"""A model file kvplan cannot read as it is meant is refused, never guessed at.

A JSON in neither convention (Hugging Face config.json, Meta's params.json) is refused with the
keys it lacks. A KV-head key kvplan does not read would have priced attention as MHA: for a
32-head model in 8 groups, 4x the true bytes, silently; it now stops the estimate by name.
"""

import json
import sys

import pytest

from kvplan.cli import main
from kvplan.errors import KvplanError
from kvplan.sizing.kv_math import bytes_per_token
from kvplan.sizing.models.model_source import load_model_spec
from kvplan.sizing.models.model_spec import ModelSpec

# Llama-3.1-8B's numbers: 32 layers, 32 query heads, 8 KV heads of 128
LLAMA = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, "max_position_embeddings": 8192}
GQA_BYTES = 32 * 2 * 8 * 128 * 2  # 131,072 per token in bf16
MHA_BYTES = 32 * 2 * 32 * 128 * 2  # what an unread KV key gave: 4x


def write(tmp_path, config: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def estimate_error(monkeypatch, capsys, model: str) -> str:
    monkeypatch.setattr(sys, "argv", ["kvplan", "estimate", "--model", model])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == "" and err.count("\n") == 1, err
    return err


def test_the_keys_kvplan_reads_price_gqa(tmp_path):
    spec = load_model_spec(write(tmp_path, {**LLAMA, "num_key_value_heads": 8, "torch_dtype": "bfloat16"}))
    assert bytes_per_token(spec) == GQA_BYTES == MHA_BYTES // 4
    chatglm = {**LLAMA, "model_type": "chatglm", "multi_query_group_num": 2, "torch_dtype": "bfloat16"}
    assert load_model_spec(write(tmp_path, chatglm)).num_kv_heads == 2
    params = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128_256}
    assert bytes_per_token(load_model_spec(write(tmp_path, params, "params.json"))) == GQA_BYTES


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"num_kv_groups": 8}, "num_kv_groups"),
        ({"kv_heads": 8}, "kv_heads"),
        ({"n_kv_groups": 8}, "n_kv_groups"),
        ({"num_key_value_groups": 4}, "num_key_value_groups"),
        ({"num_query_groups": 8}, "num_query_groups"),  # Megatron's name
        ({"attn_config": {"kv_n_heads": 8}}, "attn_config.kv_n_heads"),  # MPT, DBRX
        ({"text_config": {**LLAMA, "num_kv_heads_total": 8}}, "text_config.num_kv_heads_total"),
    ],
)
def test_an_unread_kv_key_stops_the_estimate_by_name(monkeypatch, capsys, tmp_path, extra, key):
    path = write(tmp_path, {**LLAMA, "model_type": "llama", **extra})
    err = estimate_error(monkeypatch, capsys, path)
    assert err.startswith(f"error: {path}: field {key} speaks of KV heads or groups, and kvplan does not read it;")
    assert "give the KV head count as num_key_value_heads in a copy of the file" in err
    # the same dict handed over in process (a preset, transformers' to_dict()) stops too
    with pytest.raises(KvplanError, match=f"^mine: field {key} speaks of KV heads"):
        ModelSpec.from_hf_config({**LLAMA, "model_type": "llama", **extra}, "mine")


def test_an_unread_kv_key_stops_even_beside_a_read_one(tmp_path):
    with pytest.raises(KvplanError, match="field num_kv_groups speaks of KV heads"):
        load_model_spec(write(tmp_path, {**LLAMA, "num_key_value_heads": 8, "num_kv_groups": 8}))


def test_a_params_json_with_an_unread_kv_key_stops_with_meta_spelling(tmp_path):
    params = write(tmp_path, {"dim": 4096, "n_layers": 32, "n_heads": 32, "kv_heads": 8}, "params.json")
    with pytest.raises(KvplanError, match="field kv_heads speaks of KV heads.*give the KV head count as n_kv_heads"):
        load_model_spec(params)


def test_null_keys_and_other_towers_are_not_kv_heads(tmp_path):
    config = {
        **LLAMA,
        "num_key_value_heads": 8,
        "num_kv_groups": None,  # unset says nothing
        "vision_config": {"num_kv_heads_vit": 16},  # the vision tower's attention, not the LM's cache
        "quantization_config": {"kv_group_size": 64, "bits": 4},
        "torch_dtype": "bfloat16",
    }
    assert load_model_spec(write(tmp_path, config)).num_kv_heads == 8


@pytest.mark.parametrize(
    ("config", "meta_lacks"),
    [
        ({"layers": 32, "heads": 32, "kv_groups": 8, "hidden": 4096}, "n_layers, dim"),
        ({"num_attention_heads": 8, "hidden_size": 512}, "n_layers, dim"),
        ({"dim": 4096, "heads": 32}, "n_layers"),
    ],
)
def test_a_json_in_neither_convention_is_refused_with_what_it_lacks(monkeypatch, capsys, tmp_path, config, meta_lacks):
    path = write(tmp_path, config, "model.json")
    err = estimate_error(monkeypatch, capsys, path)
    assert err == (
        f"error: {path}: a JSON in neither convention kvplan reads: it lacks num_hidden_layers, model_type,"
        f" architectures (a Hugging Face config.json) and {meta_lacks} (Meta's params.json); give the model's"
        " config.json, its params.json or its .gguf file\n"
    )
