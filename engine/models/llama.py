"""Our Llama-family decoder (Llama, Qwen2, Mistral without sliding window), gpt-fast style.

It runs over the flattened tokens of one engine step, not a padded batch::

    input_ids [num_tokens], positions [num_tokens]
      -> embed -> n x (x + attn(norm(x)); x + mlp(norm(x))) -> hidden [num_tokens, dim]
    compute_logits(hidden[rows]) -> norm -> lm_head -> [rows, vocab] fp32

Attention writes each token's K/V into the paged cache through ``meta.slot_mapping`` and reads
every sequence's context through ``meta.block_tables`` (``engine.attention``'s backend functions).
Weights come from a transformers model's state dict (``from_hf``); q/k/v and gate/up are fused
into one matmul each. Formulas: RMSNorm (Zhang & Sennrich, 2019), RoPE in the rotate-half layout
transformers uses (Su et al., "RoFormer", 2021), SwiGLU (Shazeer, "GLU Variants", 2020), GQA
(Ainslie et al., 2023); the arithmetic order follows transformers' LlamaRMSNorm and rotary code so
fp32 results agree with ``generate``.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.kv_cache import KVCache, LayerKV
from engine.models.packed import pack_linears

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, computed in fp32 and cast back
    before the weight multiply (transformers' order). x: [..., dim]."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(config, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_position_embeddings, head_dim] in ``dtype``, indexed by position.

    theta and any scaling (linear, llama3, yarn) come from ``config.rope_parameters`` through
    transformers' own ``ROPE_INIT_FUNCTIONS``; the default is inv_freq_i = theta^(-2i/head_dim).
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = config.rope_parameters
    head_dim = config_head_dim(config)
    if rope.get("rope_type", "default") == "default":
        inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        attention_scaling = 1.0
    else:
        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config)
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float)
    freqs = positions[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * attention_scaling).to(dtype), (emb.sin() * attention_scaling).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim]; cos, sin: [num_tokens, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class Attention(nn.Module):
    """GQA self-attention over the paged cache. x: [num_tokens, dim] -> [num_tokens, dim].

    Writes this step's K/V through ``meta.slot_mapping`` first, then attends through
    ``meta.block_tables``; ``backend`` is an ``engine.attention`` backend module.
    """

    def __init__(
        self, dim: int, n_head: int, n_kv_head: int, head_dim: int, qkv_bias: bool, o_bias: bool, backend: ModuleType
    ):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_kv_head) * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=o_bias)
        self.scale = head_dim**-0.5
        self.backend = backend

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: LayerKV, meta: AttentionMetadata
    ) -> torch.Tensor:
        n, d = x.shape[0], self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * d, self.n_kv_head * d, self.n_kv_head * d], dim=-1)
        q = apply_rope(q.view(n, self.n_head, d), cos, sin)
        k = apply_rope(k.view(n, self.n_kv_head, d), cos, sin)
        v = v.view(n, self.n_kv_head, d)
        self.backend.write_kv_cache(k, v, kv.k_cache, kv.v_cache, meta.slot_mapping, kv.k_scale, kv.v_scale)
        o = self.backend.paged_attention(q, kv.k_cache, kv.v_cache, meta, self.scale, kv.k_scale, kv.v_scale)
        return self.wo(o.reshape(n, self.n_head * d))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(x w1) * x w3). x: [num_tokens, dim] -> [num_tokens, dim]."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)  # gate and up, fused
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm decoder layer: h = x + attn(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, config, qkv_bias: bool, o_bias: bool, backend: ModuleType):
        super().__init__()
        dim = config.hidden_size
        self.attention = Attention(
            dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            config_head_dim(config),
            qkv_bias,
            o_bias,
            backend,
        )
        self.feed_forward = FeedForward(dim, config.intermediate_size)
        self.attention_norm = RMSNorm(dim, config.rms_norm_eps)
        self.ffn_norm = RMSNorm(dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, kv: LayerKV, meta: AttentionMetadata) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, kv, meta)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The decoder. Build it with ``from_hf``; the config is a transformers Llama/Qwen2/Mistral config."""

    cos: torch.Tensor  # RoPE tables [max_position_embeddings, head_dim] (non-persistent buffers)
    sin: torch.Tensor

    def __init__(self, config, backend: ModuleType, qkv_bias: bool = False, o_bias: bool = False):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, qkv_bias, o_bias, backend) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        cos, sin = rope_tables(config, torch.get_default_dtype())
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @classmethod
    def from_hf(cls, hf_model: PreTrainedModel, backend: ModuleType) -> Transformer:
        """Take the weights of a transformers ``*ForCausalLM`` (same device and dtype as it).

        Tied embeddings (``tie_word_embeddings``) share one tensor between the embedding and the
        output layer. Bias on q/k/v (Qwen2) and on o (Llama's ``attention_bias``) follow the
        state dict's keys. bf16 weights on CPU end packed for oneDNN (engine.models.packed).
        """
        config = hf_model.config
        sd = hf_model.state_dict()
        weight = sd["model.embed_tokens.weight"]
        qkv_bias = "model.layers.0.self_attn.q_proj.bias" in sd
        o_bias = "model.layers.0.self_attn.o_proj.bias" in sd
        with torch.device("meta"):
            model = cls(config, backend, qkv_bias, o_bias)
        ours = {"tok_embeddings.weight": weight, "norm.weight": sd["model.norm.weight"]}
        ours["output.weight"] = weight if config.tie_word_embeddings else sd["lm_head.weight"]
        for i in range(config.num_hidden_layers):
            hf, me = f"model.layers.{i}.", f"layers.{i}."
            attn = hf + "self_attn."
            ours[me + "attention.wqkv.weight"] = torch.cat([sd[attn + p + "_proj.weight"] for p in "qkv"])
            if qkv_bias:
                ours[me + "attention.wqkv.bias"] = torch.cat([sd[attn + p + "_proj.bias"] for p in "qkv"])
            ours[me + "attention.wo.weight"] = sd[attn + "o_proj.weight"]
            if o_bias:
                ours[me + "attention.wo.bias"] = sd[attn + "o_proj.bias"]
            ours[me + "feed_forward.w13.weight"] = torch.cat(
                [sd[hf + "mlp.gate_proj.weight"], sd[hf + "mlp.up_proj.weight"]]
            )
            ours[me + "feed_forward.w2.weight"] = sd[hf + "mlp.down_proj.weight"]
            ours[me + "attention_norm.weight"] = sd[hf + "input_layernorm.weight"]
            ours[me + "ffn_norm.weight"] = sd[hf + "post_attention_layernorm.weight"]
        model.load_state_dict(ours, assign=True)
        cos, sin = rope_tables(config, weight.dtype)
        model.cos, model.sin = cos.to(weight.device), sin.to(weight.device)
        pack_linears(model)
        return model.eval()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        """input_ids, positions: [num_tokens] int64 -> hidden states [num_tokens, hidden_size]
        (before the final norm). Writes every token's K/V into ``kv_cache``."""
        x = self.tok_embeddings(input_ids)
        cos, sin = self.cos[positions], self.sin[positions]
        for layer, kv in zip(self.layers, kv_cache.layers):
            x = layer(x, cos, sin, kv, meta)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden_size] (rows to sample from) -> logits [n, vocab_size] fp32."""
        return self.output(self.norm(hidden)).float()


def config_head_dim(config) -> int:
    """head_dim from the config, or hidden_size / num_attention_heads when it has none."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
