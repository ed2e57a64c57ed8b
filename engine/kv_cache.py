"""The paged KV cache: one K and one V tensor per layer, each a pool of blocks.

Per layer::

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot s = block_id * block_size + offset   (the flat index over the first two dims)

A block id names the same slots in every layer, so one block holds ``block_size`` tokens of the
whole model: bytes_per_block = 2 (K and V) x num_layers x block_size x num_kv_heads x head_dim x
element size (vLLM's "page size" of a full-attention layer, summed over layers). The value here
is read from the allocated tensors, which makes it the oracle kvplan's estimate is tested against.

FP8 (``torch.float8_e4m3fn``): the cache stores ``fp8(x / scale)`` with one K scale and one V
scale per layer (default 1.0). ``set_scales`` is the hook a calibration pass uses to install
measured scales (amax / 448 per layer: ``LLMEngine.calibrate_kv_scales``, engine/kv_scales.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import SettingError


@dataclass(frozen=True)
class LayerKV:
    """One layer's cache tensors and their fp8 dequantisation scales (1.0 for other dtypes)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0


def is_oom_error(e: BaseException) -> bool:
    """torch's OutOfMemoryError (CUDA), or a CPU allocator failure ("can't allocate memory")."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    message = str(e).lower()
    return isinstance(e, RuntimeError) and ("out of memory" in message or "can't allocate memory" in message)


def bytes_per_block_for(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one block takes over all layers, K and V, before allocating anything (for sizing)."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element_size


class KVCache:
    """K/V tensors of every layer, zero-initialised.

    Zeros, not ``torch.empty``: attention masks unused slots with a weight of 0, and 0 x NaN from
    uninitialised memory would still poison the output.

    Args:
        num_layers, num_kv_heads, head_dim: from the model config.
        block_size: token slots per block.
        dtype: cache dtype (bf16, fp16, fp32 or torch.float8_e4m3fn).
        num_blocks: pool size in blocks; or ``memory_bytes``: as many whole blocks as fit.

    Raises:
        ValueError: neither or both of num_blocks / memory_bytes, a budget below one block (the
            message gives the bytes one block needs), or a pool the device cannot allocate (the
            message names ``num_blocks`` or ``kv_cache_memory_bytes``, whichever set the size, and
            the bytes asked for).
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        num_blocks: int | None = None,
        memory_bytes: int | None = None,
    ):
        if (num_blocks is None) == (memory_bytes is None):
            raise ValueError("KVCache: give exactly one of num_blocks or memory_bytes")
        per_block = bytes_per_block_for(num_layers, block_size, num_kv_heads, head_dim, dtype)
        size_field = "num_blocks" if memory_bytes is None else "kv_cache_memory_bytes"
        if num_blocks is None:
            assert memory_bytes is not None  # exactly one of the two is given (checked above)
            num_blocks = memory_bytes // per_block
            if num_blocks < 1:
                raise SettingError(
                    "kv_cache_memory_bytes", f"must hold at least one block of {per_block} bytes (got {memory_bytes})"
                )
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.block_size = block_size
        self.dtype = dtype
        try:
            self.k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
            self.v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not is_oom_error(e):
                raise
            raise SettingError(
                size_field,
                f"a KV cache of {num_blocks:,} blocks x {per_block:,} bytes = "
                f"{num_blocks * per_block:,} bytes cannot be allocated on {device}; lower {size_field}",
            ) from None
        self.set_scales([1.0] * num_layers, [1.0] * num_layers)

    @property
    def num_blocks(self) -> int:
        return self.k_caches[0].shape[0]

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block over all layers, K and V, read from the tensors themselves."""
        return sum(t[0].numel() * t.element_size() for t in (*self.k_caches, *self.v_caches))

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k_caches, *self.v_caches))

    def set_scales(self, k_scales: list[float], v_scales: list[float]) -> None:
        """Install per-layer fp8 dequantisation scales (one float per layer for K and for V).

        Call before the first step that writes K/V: values already in the cache were quantised
        with the old scales. Ignored by the backends for non-fp8 caches.

        Raises:
            ValueError: a list whose length is not the number of layers, or a scale <= 0.
        """
        num_layers = len(self.k_caches)
        if len(k_scales) != num_layers or len(v_scales) != num_layers:
            raise ValueError(f"kv scales: need one per layer ({num_layers}), got {len(k_scales)} and {len(v_scales)}")
        if min(*k_scales, *v_scales) <= 0:
            raise ValueError("kv scales: must be > 0")
        self.k_scales, self.v_scales = [float(s) for s in k_scales], [float(s) for s in v_scales]
        self.layers = tuple(
            LayerKV(k, v, ks, vs) for k, v, ks, vs in zip(self.k_caches, self.v_caches, self.k_scales, self.v_scales)
        )
