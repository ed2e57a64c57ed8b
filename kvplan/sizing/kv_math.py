"""Pure KV-cache formulas: per-layer KV specs of one GPU rank, bytes per token, block and request,
tp/pp splits.

Sources of the formulas: vLLM's KV cache interface (one frozen spec per layer kind with a page
size: full attention, sliding window, MLA, Mamba state) and the derivation written at the top of
``tests/kvplan/data/vllm_kv_logs.yaml``::

    full attention  bytes/token/layer = max(1, kv_heads // tp) x (k_head_dim + v_head_dim) x element bytes
    MLA             bytes/token/layer = (kv_lora_rank + qk_rope_head_dim) x element bytes   (no K+V, not / tp)
    sliding window  as full attention, but a layer holds only the last `sliding_window` tokens
    state           bytes/request/layer = conv state + recurrent state (kvplan.sizing.models.state_shapes), 0 per token

A block holds ``block_size`` tokens of one layer; the engine's pool counts a block as
``block_size`` tokens of every layer, so ``bytes_per_block = bytes_per_token x block_size``.
Per-request bytes are the paged KV of the attention layers plus the fixed state of the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.sizing import dtypes
from kvplan.sizing.dtypes import KVDtype
from kvplan.sizing.models.layer_spec import LayerSpec
from kvplan.sizing.models.model_spec import ModelSpec
from kvplan.sizing.models.state_shapes import Shape, num_elements


@dataclass(frozen=True)
class FullAttentionSpec:
    """A layer that keeps K and V of every token: K ``[num_tokens, num_kv_heads, head_dim]``, V
    ``[num_tokens, num_kv_heads, v_head_dim]`` (``v_head_dim`` None: the same width as K)."""

    num_kv_heads: int
    head_dim: int
    dtype: KVDtype
    v_head_dim: int | None = None

    @property
    def bytes_per_token(self) -> int:
        v_dim = self.head_dim if self.v_head_dim is None else self.v_head_dim
        return self.dtype.row_bytes(self.num_kv_heads * self.head_dim) + self.dtype.row_bytes(self.num_kv_heads * v_dim)

    state_bytes = 0

    def tokens_held(self, num_tokens: int) -> int:
        return num_tokens

    def blocks_held(self, num_tokens: int, block_size: int) -> range:
        """Block indices this layer still holds for a sequence of ``num_tokens`` tokens."""
        return range(0, math.ceil(num_tokens / block_size))


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    """A local-attention layer: only the last ``sliding_window`` tokens are kept.

    Blocks wholly before the window are freed (vLLM v1's sliding-window manager does the same),
    so the blocks held are those that the window ``[num_tokens - window, num_tokens)`` touches.
    """

    sliding_window: int = 0

    def tokens_held(self, num_tokens: int) -> int:
        return min(num_tokens, self.sliding_window)

    def blocks_held(self, num_tokens: int, block_size: int) -> range:
        first = max(0, num_tokens - self.sliding_window) // block_size
        return range(first, math.ceil(num_tokens / block_size))


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): one compressed latent per token,
    ``[num_tokens, kv_lora_rank + qk_rope_head_dim]``, shared by all heads, so no factor 2 and
    replicated (not split) across tensor-parallel ranks."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    dtype: KVDtype

    @property
    def bytes_per_token(self) -> int:
        return self.dtype.row_bytes(self.kv_lora_rank + self.qk_rope_head_dim)

    state_bytes = 0

    def tokens_held(self, num_tokens: int) -> int:
        return num_tokens

    def blocks_held(self, num_tokens: int, block_size: int) -> range:
        return range(0, math.ceil(num_tokens / block_size))


@dataclass(frozen=True)
class StateSpec:
    """A recurrent layer's fixed per-request state on one rank (linear attention, Mamba, conv):
    ``shapes[i]`` in ``dtypes[i]`` (conv state first, then the recurrent state where there is
    one); no bytes per token, whatever the request's length."""

    kind: str
    shapes: tuple[Shape, ...]
    dtypes: tuple[KVDtype, ...]

    bytes_per_token = 0

    @property
    def state_bytes(self) -> int:
        return sum(dtype.row_bytes(num_elements(shape)) for shape, dtype in zip(self.shapes, self.dtypes))

    def tokens_held(self, num_tokens: int) -> int:
        return 0

    def blocks_held(self, num_tokens: int, block_size: int) -> range:
        return range(0)


LayerKVSpec = FullAttentionSpec | SlidingWindowSpec | MLASpec | StateSpec


def kv_dtype_of(spec: ModelSpec, kv_cache_dtype: str = "auto") -> KVDtype:
    """The KV dtype ``kv_cache_dtype`` means for ``spec`` served by vLLM: ``auto`` is the dtype
    the checkpoint is served in (:func:`kvplan.sizing.dtypes.serving_dtype`).

    Raises:
        KvplanError: an unknown ``kv_cache_dtype``.
    """
    return dtypes.resolve(kv_cache_dtype, dtypes.serving_dtype(spec.dtype))


def kv_heads_per_rank(num_kv_heads: int, num_attention_heads: int, tp: int) -> int:
    """KV heads one tensor-parallel rank stores: ``max(1, kv_heads // tp)``; heads are replicated
    when tp exceeds them (vLLM's rule).

    Raises:
        KvplanError: tp < 1, tp does not divide the attention heads, or tp and the KV heads
            divide neither way (vLLM refuses both).
    """
    if tp < 1:
        raise KvplanError("tp", f"must be >= 1 (got {tp})")
    if num_attention_heads % tp:
        raise KvplanError(
            "tp", f"{tp} does not divide the {num_attention_heads} attention heads", "pick a divisor of the head count"
        )
    if num_kv_heads % tp and tp % num_kv_heads:
        raise KvplanError("tp", f"{tp} and the {num_kv_heads} KV heads do not divide one another", "pick another tp")
    return max(1, num_kv_heads // tp)


def pipeline_stages(num_layers: int, pp: int) -> list[range]:
    """Contiguous layer ranges of the ``pp`` pipeline stages.

    Layers split evenly; the ``num_layers % pp`` extra layers go one each to the stages just before
    the last one (vLLM's ``get_pp_indices`` split, which spares the last stage that also holds the
    LM head).

    Raises:
        KvplanError: pp < 1 or more stages than layers.
    """
    if pp < 1 or pp > num_layers:
        raise KvplanError("pp", f"must be between 1 and the {num_layers} layers (got {pp})")
    sizes = [num_layers // pp] * pp
    for i in range(num_layers % pp):
        sizes[-2 - i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(range(start, start + size))
        start += size
    return stages


def layers_bytes_per_token(layers: tuple[LayerKVSpec, ...]) -> int:
    """KV bytes one new token costs across ``layers`` while every layer still holds it."""
    return sum(layer.bytes_per_token for layer in layers)


def request_state_bytes(layers: tuple[LayerKVSpec, ...]) -> int:
    """Fixed bytes every request holds in ``layers`` whatever its length (recurrent states)."""
    return sum(layer.state_bytes for layer in layers)


def request_bytes(layers: tuple[LayerKVSpec, ...], num_tokens: int, block_size: int | None = None) -> int:
    """Everything one sequence of ``num_tokens`` tokens holds: its KV (:func:`request_kv_bytes`)
    plus the fixed state of the recurrent layers."""
    return request_kv_bytes(layers, num_tokens, block_size) + request_state_bytes(layers)


def request_kv_bytes(layers: tuple[LayerKVSpec, ...], num_tokens: int, block_size: int | None = None) -> int:
    """KV bytes one sequence of ``num_tokens`` tokens holds.

    ``block_size=None``: exact tokens held (sliding layers capped at their window). Otherwise paged:
    whole blocks of ``block_size`` tokens per layer, the last one partly empty.
    """
    if block_size is None:
        return sum(layer.tokens_held(num_tokens) * layer.bytes_per_token for layer in layers)
    return sum(len(layer.blocks_held(num_tokens, block_size)) * block_size * layer.bytes_per_token for layer in layers)


def shared_prefix_bytes(layers: tuple[LayerKVSpec, ...], num_tokens: int, prefix_tokens: int, block_size: int) -> int:
    """Paged bytes of a shared prefix's full blocks still held at ``num_tokens`` tokens.

    Only full blocks can be shared (a prefix cache hit covers whole blocks); a sliding layer that
    has moved past part of the prefix no longer holds those blocks.
    """
    num_full_prefix_blocks = min(prefix_tokens, num_tokens) // block_size
    total = 0
    for layer in layers:
        held = layer.blocks_held(num_tokens, block_size)
        shared = max(0, min(held.stop, num_full_prefix_blocks) - held.start)
        total += shared * block_size * layer.bytes_per_token
    return total


def batch_kv_bytes(
    layers: tuple[LayerKVSpec, ...], num_tokens: int, batch_size: int, block_size: int, prefix_tokens: int = 0
) -> int:
    """Paged bytes of ``batch_size`` sequences of ``num_tokens`` tokens whose first ``prefix_tokens``
    are shared: the prefix's full blocks are stored once, not ``batch_size`` times; every request
    keeps its own fixed state."""
    per_request = request_bytes(layers, num_tokens, block_size)
    shared = shared_prefix_bytes(layers, num_tokens, prefix_tokens, block_size) if batch_size > 1 else 0
    return batch_size * per_request - (batch_size - 1) * shared


def stage_layer_specs(
    spec: ModelSpec, kv_cache_dtype: str = "auto", tp: int = 1, pp: int = 1
) -> list[tuple[LayerKVSpec, ...]]:
    """Per-layer cache specs of one GPU rank in each pipeline stage (all tp ranks of a stage are
    alike): one spec per attention layer, one per recurrent state (a Falcon-H1 layer has both),
    none for a layer without cache.

    Raises:
        KvplanError: bad tp, pp or KV dtype (see :func:`kv_heads_per_rank`, :func:`pipeline_stages`),
            or a tp that does not divide a recurrent state's heads or channels.
    """
    dtype = kv_dtype_of(spec, kv_cache_dtype)
    state_dtype = dtypes.DTYPES[dtypes.serving_dtype(spec.dtype)]
    stages = pipeline_stages(spec.num_layers, pp)
    per_layer = [_rank_specs(spec, layer, dtype, state_dtype, tp) for layer in spec.layers]
    return [tuple(s for i in stage for s in per_layer[i]) for stage in stages]


def _rank_specs(spec: ModelSpec, layer: LayerSpec, dtype: KVDtype, state_dtype: KVDtype, tp: int) -> list[LayerKVSpec]:
    out: list[LayerKVSpec] = []
    if layer.kind == "mla":
        mla = spec.mla
        assert mla is not None  # MLA layers are built only from a config with MLA dims (ModelSpec.mla)
        out.append(MLASpec(mla.kv_lora_rank, mla.qk_rope_head_dim, dtype))
    elif layer.kind in ("full", "sliding"):
        heads = kv_heads_per_rank(layer.num_kv_heads, spec.num_attention_heads, tp)
        v_dim = None if layer.v_head_dim == layer.k_head_dim else layer.v_head_dim
        if layer.kind == "sliding":
            window = layer.sliding_window
            assert window is not None  # layer_kinds makes a layer sliding only with a window (or chunk) size
            out.append(SlidingWindowSpec(heads, layer.k_head_dim, dtype, v_dim, sliding_window=window))
        else:
            out.append(FullAttentionSpec(heads, layer.k_head_dim, dtype, v_dim))
    if layer.state is not None:
        shapes = layer.state.shapes(tp)
        ssm = layer.state.ssm_dtype
        recurrent = dtypes.resolve(ssm, state_dtype.name, "mamba_ssm_dtype") if ssm else state_dtype
        out.append(StateSpec(layer.state.kind, shapes, (state_dtype, recurrent)[: len(shapes)]))
    return out


def rank_layer_specs(
    spec: ModelSpec, kv_cache_dtype: str = "auto", tp: int = 1, pp: int = 1
) -> tuple[LayerKVSpec, ...]:
    """The layers of the limiting pipeline stage (:func:`limiting_stage`)."""
    return limiting_stage(stage_layer_specs(spec, kv_cache_dtype, tp, pp))


def limiting_stage(stages: list[tuple[LayerKVSpec, ...]]) -> tuple[LayerKVSpec, ...]:
    """The stage with the most KV bytes per token, then the most fixed state: with equal GPUs,
    that stage runs out of KV memory first and so limits the whole pipeline."""
    return max(stages, key=lambda stage: (layers_bytes_per_token(stage), request_state_bytes(stage)))


def bytes_per_token(spec: ModelSpec, kv_cache_dtype: str = "auto", tp: int = 1, pp: int = 1) -> int:
    """KV bytes one token costs on one GPU rank (the limiting pipeline stage), every attention layer
    counted as if it still held the token (sliding-window layers included); recurrent layers cost
    nothing per token (their fixed state is :func:`request_state_bytes`).

    Examples (hand arithmetic): 32 layers x 2 x 8 KV heads x 128 x 2 bytes (bf16) = 131,072;
    DeepSeek-V3: 61 x (512 + 64) x 2 = 70,272; Llama-3.1-70B at tp=32: 80 x 2 x 1 x 128 x 2 = 40,960.

    Raises:
        KvplanError: bad tp, pp or KV dtype.
    """
    return layers_bytes_per_token(rank_layer_specs(spec, kv_cache_dtype, tp, pp))
