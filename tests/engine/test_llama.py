"""Our decoder against transformers' own modules on the same weights (fp32), for the Llama-family
variants it claims: plain Llama with GQA, Qwen2 (q/k/v bias, tied embeddings), Llama with
attention bias and llama3 rope scaling; plus RMSNorm and the rope table by hand."""

from __future__ import annotations

import math

import pytest
import torch

from engine.attention import AttentionMetadata, torch_ref
from engine.kv_cache import KVCache
from engine.models.llama import RMSNorm, Transformer, rope_tables
from tests.engine.tiny import random_prompts, tiny_hf_model

SMALL = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def one_sequence_meta(start: int, end: int, block_size: int) -> AttentionMetadata:
    """Tokens [start, end) of one sequence whose blocks are 0, 1, 2, ... in order."""
    num_blocks = -(-end // block_size)
    return AttentionMetadata(
        slot_mapping=torch.arange(start, end),  # block i holds positions [i*bs, (i+1)*bs)
        query_start_loc=torch.tensor([0, end - start], dtype=torch.int32),
        seq_lens=torch.tensor([end], dtype=torch.int32),
        block_tables=torch.arange(num_blocks, dtype=torch.int32)[None],
        num_decodes=1 if end - start == 1 else 0,
        max_query_len=end - start,
        max_seq_len=end,
    )


@torch.inference_mode()
def our_logits(hf, ids: list[int], chunks: tuple[int, ...] = ()) -> torch.Tensor:
    """Logits at every position [len(ids), vocab] from our model, prefilling in the given chunks."""
    cfg = hf.config
    model = Transformer.from_hf(hf, torch_ref)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    cache = KVCache(
        cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim, 4, torch.float32, torch.device("cpu"), num_blocks=16
    )
    bounds = [0, *chunks, len(ids)]
    rows = []
    for start, end in zip(bounds, bounds[1:]):
        hidden = model(torch.tensor(ids[start:end]), torch.arange(start, end), cache, one_sequence_meta(start, end, 4))
        rows.append(model.compute_logits(hidden))
    return torch.cat(rows)


@torch.inference_mode()
def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0].float()


def sharpen(model: torch.nn.Module) -> torch.nn.Module:
    """Redraw every weight at unit scale (std 1/sqrt(fan_in) for matrices, norms 1 +- 0.5, biases 0.5).

    transformers' init (std 0.02, zero biases) leaves attention almost uniform, so a wrong rope
    angle or a dropped bias would hide under 1e-5; at this scale both move logits by far more.
    """
    torch.manual_seed(5)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            p.data.normal_(0, 1.0 if "embed" in name else p.shape[1] ** -0.5)
        elif name.endswith(".bias"):
            p.data.normal_(0, 0.5)
        else:
            p.data.normal_(1.0, 0.5)
    return model


@pytest.mark.parametrize("chunks", [(), (5,), (3, 11, 12)])
def test_llama_matches_transformers_whole_and_chunked(chunks):
    hf = sharpen(tiny_hf_model())
    ids = random_prompts((19,))[0]
    torch.testing.assert_close(our_logits(hf, ids, chunks), hf_logits(hf, ids), rtol=1e-4, atol=1e-4)


def test_qwen2_bias_and_tied_embeddings_match_transformers():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(**SMALL, tie_word_embeddings=True, rope_theta=1e6)).eval()
    sharpen(hf)
    attn = hf.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None
    ids = random_prompts((13,))[0]
    ours = our_logits(hf, ids, (6,))
    torch.testing.assert_close(ours, hf_logits(hf, ids), rtol=1e-4, atol=1e-4)


def test_llama_attention_bias_and_llama3_rope_scaling_match_transformers():
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {
        "rope_type": "llama3",
        "rope_theta": 50000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**SMALL, attention_bias=True, rope_parameters=rope)).eval()
    sharpen(hf)
    ids = random_prompts((40,))[0]
    torch.testing.assert_close(our_logits(hf, ids, (17,)), hf_logits(hf, ids), rtol=1e-4, atol=1e-4)


def test_rope_table_reads_theta_from_the_config():
    from transformers import LlamaConfig

    config = LlamaConfig(**SMALL, rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    cos, sin = rope_tables(config, torch.float32)
    assert cos.shape == sin.shape == (256, 16)  # [max_position_embeddings, head_dim]
    # Position 3, frequency pair i = 2 of head_dim 16: angle 3 * 100000^(-4/16); both halves equal.
    angle = 3 * 100000.0 ** (-4 / 16)
    assert cos[3, 2].item() == pytest.approx(math.cos(angle), rel=1e-6)
    assert sin[3, 2 + 8].item() == pytest.approx(math.sin(angle), rel=1e-6)
    assert cos[0].tolist() == [1.0] * 16


def test_rmsnorm_by_hand():
    norm = RMSNorm(2, eps=0.0)
    norm.weight.data = torch.tensor([1.0, 2.0])
    # rms([3, 4]) = sqrt((9 + 16) / 2) = 3.5355...; [3, 4] / rms = [0.8485, 1.1314]; times weight.
    out = norm(torch.tensor([[3.0, 4.0]]))
    torch.testing.assert_close(out, torch.tensor([[3 / math.sqrt(12.5), 2 * 4 / math.sqrt(12.5)]]))
