"""KVEstimate: capacity plus the per-request grid, the one result `kvplan estimate` renders.

Grid row for ``batch_size`` requests of ``context_tokens`` tokens each, on one GPU rank::

    kv_bytes          what the tokens need: sliding layers capped at their window, a shared
                      prefix's full blocks counted once, each request's fixed state (recurrent
                      layers) counted per request
    paged_bytes       whole blocks of block_size tokens per layer (the last block partly empty),
                      plus the fixed states
    contiguous_bytes  a max_model_len reservation per request, as a non-paged cache makes
    *_waste_bytes     paged_bytes or contiguous_bytes minus kv_bytes
    fits              False when a context exceeds max_model_len (a server refuses such a request,
                      whatever the memory) or paged_bytes exceed the KV pool; True when they fit;
                      None with no KV budget to compare (no gpu, gpu_memory_gib or kv_memory_gib)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvplan.errors import KvplanError
from kvplan.sizing import kv_math
from kvplan.sizing.capacity import MAX_TOKENS, Capacity, estimate_capacity
from kvplan.sizing.models.model_spec import ModelSpec

SCHEMA_VERSION = 1
MAX_BATCH = 2**20  # requests per grid row; far beyond any server's max_num_seqs


@dataclass(frozen=True)
class GridRow:
    """KV of ``batch_size`` requests of ``context_tokens`` tokens on one GPU rank (bytes)."""

    context_tokens: int
    batch_size: int
    kv_bytes: int
    paged_bytes: int
    paged_waste_bytes: int
    contiguous_bytes: int
    contiguous_waste_bytes: int
    exceeds_max_model_len: bool
    fits: bool | None  # see the module docstring: False also when over max_model_len


@dataclass(frozen=True)
class KVEstimate:
    """Everything `kvplan estimate` prints; ``to_dict`` is its JSON form."""

    capacity: Capacity
    shared_prefix_tokens: int
    per_request_contiguous_bytes: int
    grid: tuple[GridRow, ...]
    layers: tuple[kv_math.LayerKVSpec, ...]  # the limiting rank's layers, for plots

    def to_dict(self) -> dict:
        """JSON-ready dict: the capacity fields at top level, the grid, then the limiting rank's
        cache layers (:func:`layer_entry`), whose ``bytes_per_token`` and ``state_bytes`` sum to
        the top-level ``bytes_per_token`` and ``per_request_state_bytes``."""
        out = {"schema_version": SCHEMA_VERSION, **asdict(self.capacity)}
        out["shared_prefix_tokens"] = self.shared_prefix_tokens
        out["per_request_contiguous_bytes"] = self.per_request_contiguous_bytes
        out["grid"] = [asdict(row) for row in self.grid]
        out["layer_kind_counts"] = layer_kind_counts(self.layers)
        out["layers"] = [layer_entry(layer) for layer in self.layers]
        return out


def layer_kind_counts(layers: tuple[kv_math.LayerKVSpec, ...]) -> dict[str, int]:
    """How many cache layers of each kind the rank holds (``{"full": 12, "linear": 36}``)."""
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer_kind(layer)] = counts.get(layer_kind(layer), 0) + 1
    return counts


def layer_kind(layer: kv_math.LayerKVSpec) -> str:
    """full, sliding, mla, or the state's kind (linear, mamba, conv)."""
    if isinstance(layer, kv_math.StateSpec):
        return layer.kind
    if isinstance(layer, kv_math.MLASpec):
        return "mla"
    return "sliding" if isinstance(layer, kv_math.SlidingWindowSpec) else "full"


def layer_entry(layer: kv_math.LayerKVSpec) -> dict:
    """One cache layer of a rank as JSON: kind, KV heads, K and V widths (MLA: the latent as K),
    window, dtype(s), bytes per token and fixed state bytes (with the state's shapes)."""
    entry = {"kind": layer_kind(layer), "num_kv_heads": 0, "k_head_dim": 0, "v_head_dim": 0, "sliding_window": None}
    if isinstance(layer, kv_math.StateSpec):
        entry["dtype"] = [dtype.name for dtype in layer.dtypes]
        entry["state_shapes"] = [list(shape) for shape in layer.shapes]
    elif isinstance(layer, kv_math.MLASpec):
        entry.update(num_kv_heads=1, k_head_dim=layer.kv_lora_rank + layer.qk_rope_head_dim, dtype=layer.dtype.name)
    else:
        v_dim = layer.head_dim if layer.v_head_dim is None else layer.v_head_dim
        entry.update(
            num_kv_heads=layer.num_kv_heads,
            k_head_dim=layer.head_dim,
            v_head_dim=v_dim,
            dtype=layer.dtype.name,
            sliding_window=getattr(layer, "sliding_window", None),
        )
    entry.update(bytes_per_token=layer.bytes_per_token, state_bytes=layer.state_bytes)
    return entry


def estimate(
    spec: ModelSpec,
    *,
    contexts: tuple[int, ...] = (),
    batch_sizes: tuple[int, ...] = (1,),
    shared_prefix_tokens: int = 0,
    **capacity_settings,
) -> KVEstimate:
    """Capacity (see :func:`kvplan.sizing.capacity.estimate_capacity` for ``capacity_settings``) and the
    grid of ``contexts`` x ``batch_sizes`` (contexts default to max_model_len).

    Raises:
        KvplanError: a bad setting, named by its flag: contexts outside [1, MAX_TOKENS], batch
            sizes outside [1, MAX_BATCH], or a shared prefix longer than a context.
    """
    for flag, values, most in (("context", contexts, MAX_TOKENS), ("batch", batch_sizes, MAX_BATCH)):
        bad = [v for v in values if not 1 <= v <= most]
        if bad:
            raise KvplanError(flag, f"values must be between 1 and {most:,} (got {bad[0]})")
    capacity = estimate_capacity(spec, **capacity_settings)
    shortest = min(contexts or (capacity.max_model_len,))
    if not 0 <= shared_prefix_tokens <= shortest:
        what = "the shortest `context`" if contexts else "the context (max_model_len)"
        raise KvplanError(
            "shared_prefix_tokens",
            f"must be between 0 and {what} {shortest:,} (got {shared_prefix_tokens})",
            "the shared prefix is part of every request",
        )
    layers = kv_math.rank_layer_specs(spec, capacity_settings.get("kv_cache_dtype", "auto"), capacity.tp, capacity.pp)
    block_size, max_len = capacity.block_size, capacity.max_model_len
    reservation = kv_math.request_bytes(layers, max_len)
    pool = capacity.kv_budget_bytes
    if capacity.num_blocks is not None:
        pool = capacity.num_blocks * capacity.bytes_per_block
    rows = []
    for context in contexts or (max_len,):
        for batch in batch_sizes:
            prefix = shared_prefix_tokens  # <= every context (checked above)
            shared = kv_math.shared_prefix_bytes(layers, context, prefix, block_size) if batch > 1 else 0
            needed = batch * kv_math.request_bytes(layers, context) - (batch - 1) * shared
            paged = kv_math.batch_kv_bytes(layers, context, batch, block_size, prefix)
            contiguous = batch * max(reservation, kv_math.request_bytes(layers, context))
            rows.append(
                GridRow(
                    context_tokens=context,
                    batch_size=batch,
                    kv_bytes=needed,
                    paged_bytes=paged,
                    paged_waste_bytes=paged - needed,
                    contiguous_bytes=contiguous,
                    contiguous_waste_bytes=contiguous - needed,
                    exceeds_max_model_len=context > max_len,
                    fits=False if context > max_len else (None if pool is None else paged <= pool),
                )
            )
    return KVEstimate(capacity, shared_prefix_tokens, reservation, tuple(rows), layers)
