"""FP8 KV-cache calibration: per-layer K and V scales measured on a few prompts.

::

    prompts --model (model dtype)--> scratch paged cache in the model dtype
        (K after RoPE and V: exactly the values an fp8 cache would quantise)
      --> per layer: k_amax = max |K|, v_amax = max |V| over every prompt token and KV head
      --> k_scale = k_amax / 448, v_scale = v_amax / 448

448 is the largest finite float8_e4m3fn value (OCP 8-bit Floating Point Specification (OFP8),
rev. 1.0, 2023: E4M3 S.1111.110 = 1.75 x 2^8; ``torch.finfo(torch.float8_e4m3fn).max``). With
scale = amax / 448 the largest value seen in calibration lands on the top of the fp8 range, so
the calibration prompts use e4m3's whole range and none of them is clipped (per-tensor absmax
scaling; vLLM's "Quantized KV Cache" doc describes the same per-tensor k/v scales, 1.0 when
uncalibrated). Larger values met later are clamped to +-448 by the cache write.

The pass runs through the engine's own model and attention backend, one prompt at a time, into
a cache of its own: the engine's pool and its block manager are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.torch_ref import FP8_MAX
from engine.kv_cache import KVCache
from engine.model_runner import ModelRunner
from engine.models.llama import Transformer, config_head_dim
from engine.outputs import ScheduledRequest, SchedulerOutput


@dataclass(frozen=True)
class KVScales:
    """Calibrated fp8 dequantisation scales, one per layer, and what they came from.

    k_scales, v_scales: amax / 448 per layer (1.0 for a layer whose amax is 0). k_amax, v_amax:
    the measured max |K| (after RoPE) and max |V| per layer, in the model's units.
    num_prompts, num_tokens: the calibration prompts and their total tokens.
    """

    k_scales: tuple[float, ...]
    v_scales: tuple[float, ...]
    k_amax: tuple[float, ...]
    v_amax: tuple[float, ...]
    num_prompts: int
    num_tokens: int


def scale_from_amax(amax: float) -> float:
    """amax / 448 (e4m3's largest finite value); 1.0 for an all-zero tensor (any scale works)."""
    return amax / FP8_MAX if amax > 0 else 1.0


@torch.inference_mode()
def measure_kv_scales(
    model: Transformer, prompts: list[list[int]], block_size: int, dtype: torch.dtype, device: torch.device
) -> KVScales:
    """Prefill each prompt alone into a scratch cache of ``dtype`` and take per-layer amax.

    prompts: token ids, each non-empty and no longer than the model's positions (the caller
    checks). The scratch cache holds the longest prompt (ceil(len / block_size) blocks) and is
    reused: after each prompt its max is folded into the running max, so stale slots from an
    earlier prompt never raise it.
    """
    config = model.config
    max_len = max(len(p) for p in prompts)
    num_blocks = -(-max_len // block_size)
    scratch = KVCache(
        config.num_hidden_layers,
        config.num_key_value_heads,
        config_head_dim(config),
        block_size,
        dtype,
        device,
        num_blocks=num_blocks,
    )
    runner = ModelRunner(model, scratch, device)
    num_layers = config.num_hidden_layers
    k_amax = torch.zeros(num_layers, dtype=torch.float32)
    v_amax = torch.zeros(num_layers, dtype=torch.float32)
    for prompt in prompts:
        table = tuple(range(-(-len(prompt) // block_size)))
        runner.execute(
            SchedulerOutput(
                scheduled=(ScheduledRequest("calibration", tuple(prompt), 0, table, sample=False),),
                num_prefill_tokens=len(prompt),
                num_decode_tokens=0,
            )
        )
        k_amax = torch.maximum(k_amax, torch.stack([k.abs().amax().float().cpu() for k in scratch.k_caches]))
        v_amax = torch.maximum(v_amax, torch.stack([v.abs().amax().float().cpu() for v in scratch.v_caches]))
    k, v = k_amax.tolist(), v_amax.tolist()
    return KVScales(
        k_scales=tuple(scale_from_amax(a) for a in k),
        v_scales=tuple(scale_from_amax(a) for a in v),
        k_amax=tuple(k),
        v_amax=tuple(v),
        num_prompts=len(prompts),
        num_tokens=sum(map(len, prompts)),
    )
