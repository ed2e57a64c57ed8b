"""An fp8 KV cache built outside our engine: transformers' own Llama with its K/V rounded to e4m3.

``E4M3Cache`` is a transformers ``DynamicCache`` whose ``update`` stores every new K (after RoPE,
as transformers passes it) and V as ``fp8(clamp(x / scale, +-448)) * scale`` per layer before
attention reads them: the model an fp8 KV cache with per-tensor scales defines, written without
any of our engine's code. ``hf_kv_amax`` reads per-layer max |K| and max |V| from transformers'
plain cache, for checking calibration independently.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def e4m3_round_trip(x: torch.Tensor, scale: float) -> torch.Tensor:
    return ((x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


class E4M3Cache(DynamicCache):
    """transformers' dynamic KV cache holding e4m3-rounded K and V (scales per layer)."""

    def __init__(self, k_scales, v_scales, config):
        super().__init__(config=config)
        self.k_scales, self.v_scales = list(k_scales), list(v_scales)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        key = e4m3_round_trip(key_states, self.k_scales[layer_idx])
        value = e4m3_round_trip(value_states, self.v_scales[layer_idx])
        return super().update(key, value, layer_idx, *args, **kwargs)


@torch.inference_mode()
def hf_kv_amax(hf_model, prompts: list[list[int]]) -> tuple[list[float], list[float]]:
    """Per layer, max |K| (after RoPE) and max |V| over every prompt, from transformers' cache."""
    num_layers = hf_model.config.num_hidden_layers
    k_amax, v_amax = [0.0] * num_layers, [0.0] * num_layers
    for prompt in prompts:
        cache = DynamicCache(config=hf_model.config)
        hf_model(torch.tensor([prompt]), cache=cache, use_cache=True)
        for i, layer in enumerate(cache.layers):
            k_amax[i] = max(k_amax[i], layer.keys.abs().max().item())
            v_amax[i] = max(v_amax[i], layer.values.abs().max().item())
    return k_amax, v_amax


@torch.inference_mode()
def hf_logits(hf_model, token_ids: list[int], cache=None) -> torch.Tensor:
    """transformers' forward over one unpadded sequence: logits [len(token_ids), vocab] fp32."""
    return hf_model(torch.tensor([token_ids]), cache=cache, use_cache=cache is not None).logits[0].float()


@torch.inference_mode()
def hf_greedy_e4m3(hf_model, prompt: list[int], max_new_tokens: int, k_scales, v_scales) -> list[int]:
    """Greedy decoding (argmax, EOS ignored) by transformers' forward over an ``E4M3Cache``:
    the prompt in one pass, then one token per pass, as a cache-based decoder runs."""
    cache = E4M3Cache(k_scales, v_scales, hf_model.config)
    logits = hf_model(torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]
    tokens = []
    for _ in range(max_new_tokens):
        tokens.append(int(logits.argmax()))
        logits = hf_model(torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True).logits[0, -1]
    return tokens
