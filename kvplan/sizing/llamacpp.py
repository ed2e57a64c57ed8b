"""llama.cpp's KV buffer: the bytes ``llama-server`` allocates at start-up for a model, a context
size, a number of slots and a cache type for K and for V.

llama.cpp does not page. It allocates one K and one V tensor per attention layer, of
``n_embd_gqa x cells x streams`` elements in the cache type (src/llama-kv-cache.cpp,
``llama_kv_cache::llama_kv_cache``; each tensor's bytes are ggml's ``ggml_nbytes``)::

    n_ctx       = ctx_size rounded up to a multiple of 256     (src/llama-context.cpp: GGML_PAD(n_ctx, 256))
    unified     n_ctx_seq = n_ctx, 1 stream shared by every slot  (--kv-unified; llama-server's
                default when --parallel is left at auto, which is 4 slots)
    per slot    n_ctx_seq = pad(n_ctx / n_parallel, 256), n_parallel streams, and n_ctx becomes
                n_ctx_seq x n_parallel                      (the default when --parallel is given)
    K bytes     = layers x streams x cells x row(n_kv_heads x k_head_dim, type_k)
    V bytes     = the same with v_head_dim and type_v; none for MLA, whose latent is the K row
    row(n, t)   = n / block_elements(t) x block_bytes(t)    (n must be a whole number of blocks)

A model with sliding-window layers gets two caches (src/llama-kv-cache-iswa.cpp): the full
layers with ``n_ctx_seq`` cells, the sliding ones with ``pad(min(n_ctx_seq, n_swa x s + n_ubatch),
256)`` cells, where s is n_parallel for a unified cache and 1 per stream otherwise, n_ubatch is
``min(ctx_size, --ubatch-size)``; ``--swa-full`` gives them ``n_ctx_seq`` cells too. Recurrent
layers (Mamba, Gated DeltaNet, short convolutions) keep their state in a separate f32 buffer,
not priced here. Sources: llama.cpp as vendored by llama-cpp-python 0.3.36 (the files named);
checked against the sizes it printed in tests/kvplan/data/llamacpp_kv_buffers.yaml.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvplan.errors import KvplanError
from kvplan.sizing.models.model_spec import ModelSpec

PAD = 256  # llama.cpp pads n_ctx, n_ctx_seq and the SWA cache to 256 cells
MAX_SEQ = 256  # LLAMA_MAX_SEQ (src/llama-cparams.h): at most this many slots
MAX_CTX = 2**32 - 1 - PAD  # n_ctx is a uint32_t; room left for the padding
DEFAULT_PARALLEL = 4  # llama-server's --parallel auto (tools/server/server.cpp), then with a unified cache
DEFAULT_UBATCH = 512  # common_params.n_ubatch (common/common.h)
# Hugging Face model types whose llama.cpp architecture reads a sliding window
# (LLM_KV_ATTENTION_SLIDING_WINDOW: src/models/gemma2.cpp, gemma3.cpp, gemma3n.cpp, cohere2.cpp,
# phi3.cpp, exaone4.cpp, olmo2.cpp, llama4.cpp, openai-moe.cpp, lfm2.cpp). Others, Mistral and
# Qwen2 among them, run in llama.cpp's "llama" / "qwen2" architectures with every layer full.
SWA_MODEL_TYPES = frozenset(
    ("gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "cohere2", "phi3", "exaone4", "olmo2")
    + ("olmo3", "llama4", "llama4_text", "gpt_oss", "lfm2")
)


@dataclass(frozen=True)
class GgmlType:
    """A ggml tensor type as a KV cache stores it: ``block_bytes`` per block of ``block_elements``
    consecutive values of one row (ggml/src/ggml.c ``type_traits``: ``type_size`` per ``blck_size``)."""

    name: str
    block_elements: int
    block_bytes: int

    def row_bytes(self, num_elements: int) -> int:
        """Bytes of one cell's row of ``num_elements`` values (ggml's ``ggml_row_size``).

        Raises:
            KvplanError: ``num_elements`` is not a whole number of blocks (ggml refuses such a tensor).
        """
        if num_elements % self.block_elements:
            raise KvplanError(
                "cache_type_k, cache_type_v",
                f"{self.name} stores rows in blocks of {self.block_elements}; this model's rows have"
                f" {num_elements} values",
                "use f16, bf16 or f32 for this model",
            )
        return num_elements // self.block_elements * self.block_bytes


# The cache types llama.cpp accepts (common/arg.cpp ``kv_cache_types``), with ggml's block sizes:
# blck_size and type_size in ggml/src/ggml.c type_traits, the block structs in ggml/src/ggml-common.h
# (q8_0: fp16 scale + 32 int8 = 34 bytes; q5_1: two fp16 + 4 bytes of high bits + 16 = 24; q5_0: 22;
# q4_1: two fp16 + 16 = 20; q4_0 and iq4_nl: fp16 + 16 = 18).
GGML_TYPES: dict[str, GgmlType] = {
    t.name: t
    for t in (
        GgmlType("f32", 1, 4),
        GgmlType("f16", 1, 2),
        GgmlType("bf16", 1, 2),
        GgmlType("q8_0", 32, 34),
        GgmlType("q5_1", 32, 24),
        GgmlType("q5_0", 32, 22),
        GgmlType("q4_1", 32, 20),
        GgmlType("q4_0", 32, 18),
        GgmlType("iq4_nl", 32, 18),
    )
}


def ggml_type(name: str, field: str) -> GgmlType:
    """The cache type ``name`` (llama.cpp's spelling, any case).

    Raises:
        KvplanError: naming ``field``, when llama.cpp has no such cache type.
    """
    found = GGML_TYPES.get(name.lower())
    if found is None:
        raise KvplanError(field, f"unknown cache type {name!r}", f"use one of {', '.join(GGML_TYPES)}")
    return found


@dataclass(frozen=True)
class LlamaCppSettings:
    """llama-server's flags that size the KV buffer. ``ctx_size`` None: the model's trained
    context (``-c 0``); ``parallel`` None: auto (4 slots, unified); ``kv_unified`` None: unified
    exactly when ``parallel`` is auto, as llama-server decides."""

    ctx_size: int | None = None
    parallel: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    kv_unified: bool | None = None
    swa_full: bool = False
    ubatch_size: int = DEFAULT_UBATCH


@dataclass(frozen=True)
class LlamaCppCache:
    """One of llama.cpp's KV caches (the non-SWA one, or the SWA one): ``cells`` per stream."""

    kind: str  # "full" or "sliding"
    cells: int
    num_streams: int
    num_layers: int
    k_bytes: int
    v_bytes: int

    @property
    def bytes(self) -> int:
        return self.k_bytes + self.v_bytes

    @property
    def mib(self) -> float:
        """MiB as llama.cpp prints it (``%.2f`` of bytes / 2**20)."""
        return round(self.bytes / 2**20, 2)


@dataclass(frozen=True)
class LlamaCppKV:
    """llama.cpp's KV buffer for one model and one set of flags; ``to_dict`` is its JSON form."""

    model: str
    n_ctx: int  # cells in all, every stream together
    n_ctx_seq: int  # the longest context one slot may hold
    n_parallel: int
    kv_unified: bool
    cache_type_k: str
    cache_type_v: str
    caches: tuple[LlamaCppCache, ...]
    num_recurrent_layers: int  # their state is in llama.cpp's separate recurrent buffer, not in these bytes
    num_full_window_layers: int = 0  # sliding-window layers llama.cpp's architecture runs as full ones

    @property
    def bytes(self) -> int:
        return sum(cache.bytes for cache in self.caches)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(engine="llama.cpp", kv_buffer_bytes=self.bytes, kv_buffer_mib=round(self.bytes / 2**20, 2))
        for entry, cache in zip(out["caches"], self.caches):
            entry.update(bytes=cache.bytes, mib=cache.mib)
        return out


def _pad(n: int) -> int:
    return -(-n // PAD) * PAD


def check_settings(settings: LlamaCppSettings) -> None:
    """Raises KvplanError (naming the field) for a ctx_size or ubatch_size below 1 or a parallel
    outside [1, 256], before any model is read."""
    if settings.ctx_size is not None and not 1 <= settings.ctx_size <= MAX_CTX:
        raise KvplanError(
            "ctx_size",
            f"must be between 1 and {MAX_CTX:,} tokens (got {settings.ctx_size})",
            "leave it out for the model's trained context (llama.cpp's -c 0)",
        )
    if settings.parallel is not None and not 1 <= settings.parallel <= MAX_SEQ:
        raise KvplanError(
            "parallel",
            f"must be between 1 and {MAX_SEQ} slots (got {settings.parallel})",
            "leave it out for llama-server's auto (4 slots, unified)",
        )
    if settings.ubatch_size < 1:
        raise KvplanError("ubatch_size", f"must be >= 1 (got {settings.ubatch_size})")


def llamacpp_kv(spec: ModelSpec, settings: LlamaCppSettings, sliding: bool = True) -> LlamaCppKV:
    """The KV buffer llama.cpp allocates for ``spec`` under ``settings`` (see the module docstring);
    ``sliding`` False: llama.cpp's architecture for the model reads no sliding window
    (``SWA_MODEL_TYPES``), so its sliding layers get full caches.

    Raises:
        KvplanError: a bad setting (:func:`check_settings`), an unknown cache type, a quantized
            cache type whose blocks do not divide the model's K or V rows, or a model without
            attention layers (llama.cpp then allocates no KV cache).
    """
    check_settings(settings)
    type_k = ggml_type(settings.cache_type_k, "cache_type_k")
    type_v = ggml_type(settings.cache_type_v, "cache_type_v")
    requested = settings.ctx_size if settings.ctx_size is not None else spec.max_position_embeddings
    parallel = settings.parallel if settings.parallel is not None else DEFAULT_PARALLEL
    unified = settings.kv_unified if settings.kv_unified is not None else settings.parallel is None
    n_ctx = _pad(requested)
    if unified:
        n_ctx_seq, streams = n_ctx, 1
    else:
        n_ctx_seq, streams = _pad(n_ctx // parallel), parallel
        n_ctx = n_ctx_seq * parallel  # llama.cpp's "n_ctx is not divisible by n_seq_max" adjustment
    attention = [layer for layer in spec.layers if layer.has_attention]
    if not attention:
        raise KvplanError("model", f"{spec.name} has no attention layers, so llama.cpp allocates no KV cache")
    caches = []
    windowed = sliding  # the sliding layers' own cache, or full ones
    for kind in ("full", "sliding"):
        layers = [layer for layer in attention if ((layer.kind == "sliding") and windowed) == (kind == "sliding")]
        if not layers:
            continue
        cells = n_ctx_seq
        if kind == "sliding" and not settings.swa_full:
            window = max(layer.sliding_window or 0 for layer in layers)
            n_ubatch = min(requested, settings.ubatch_size)
            cells = _pad(min(n_ctx_seq, window * (parallel if unified else 1) + n_ubatch))
        k_bytes = sum(type_k.row_bytes(layer.num_kv_heads * layer.k_head_dim) for layer in layers)
        v_bytes = sum(
            type_v.row_bytes(layer.num_kv_heads * layer.v_head_dim) for layer in layers if layer.kind != "mla"
        )
        caches.append(
            LlamaCppCache(kind, cells, streams, len(layers), k_bytes * cells * streams, v_bytes * cells * streams)
        )
    return LlamaCppKV(
        model=spec.name,
        n_ctx=n_ctx,
        n_ctx_seq=n_ctx_seq,
        n_parallel=parallel,
        kv_unified=unified,
        cache_type_k=type_k.name,
        cache_type_v=type_v.name,
        caches=tuple(caches),
        num_recurrent_layers=sum(layer.state is not None for layer in spec.layers),
        num_full_window_layers=0 if sliding else sum(layer.kind == "sliding" for layer in attention),
    )
