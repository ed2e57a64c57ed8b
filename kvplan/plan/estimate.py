"""KVEstimate: capacity plus the per-request grid, the one result `kvplan estimate` renders.

Grid row for ``batch_size`` requests of ``context_tokens`` tokens each, on one GPU rank::

    kv_bytes          what the tokens need: sliding layers capped at their window, a shared
                      prefix's full blocks counted once
    paged_bytes       whole blocks of block_size tokens per layer (the last block partly empty)
    contiguous_bytes  a max_model_len reservation per request, as a non-paged cache makes
    *_waste_bytes     paged_bytes or contiguous_bytes minus kv_bytes
    fits              False when a context exceeds max_model_len (a server refuses such a request,
                      whatever the memory) or paged_bytes exceed the KV pool; True when they fit;
                      None with no KV budget to compare (no gpu, gpu_memory_gib or kv_memory_gib)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvplan.errors import KvplanError
from kvplan.plan import kv_math
from kvplan.plan.capacity import MAX_TOKENS, Capacity, estimate_capacity
from kvplan.plan.model_spec import ModelSpec

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
        """JSON-ready dict: the capacity fields at top level, then the grid."""
        out = {"schema_version": SCHEMA_VERSION, **asdict(self.capacity)}
        out["shared_prefix_tokens"] = self.shared_prefix_tokens
        out["per_request_contiguous_bytes"] = self.per_request_contiguous_bytes
        out["grid"] = [asdict(row) for row in self.grid]
        return out


def estimate(
    spec: ModelSpec,
    *,
    contexts: tuple[int, ...] = (),
    batch_sizes: tuple[int, ...] = (1,),
    shared_prefix_tokens: int = 0,
    **capacity_settings,
) -> KVEstimate:
    """Capacity (see :func:`kvplan.plan.capacity.estimate_capacity` for ``capacity_settings``) and the
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
        raise KvplanError("shared_prefix_tokens", f"must be between 0 and {what} {shortest:,} "
                          f"(got {shared_prefix_tokens})", "the shared prefix is part of every request")
    layers = kv_math.rank_layer_specs(
        spec, capacity_settings.get("kv_cache_dtype", "auto"), capacity.tp, capacity.pp
    )
    block_size, max_len = capacity.block_size, capacity.max_model_len
    reservation = kv_math.request_kv_bytes(layers, max_len)
    pool = None if capacity.kv_budget_bytes is None else capacity.num_blocks * capacity.bytes_per_block
    rows = []
    for context in contexts or (max_len,):
        for batch in batch_sizes:
            prefix = shared_prefix_tokens  # <= every context (checked above)
            shared = kv_math.shared_prefix_bytes(layers, context, prefix, block_size) if batch > 1 else 0
            needed = batch * kv_math.request_kv_bytes(layers, context) - (batch - 1) * shared
            paged = kv_math.batch_kv_bytes(layers, context, batch, block_size, prefix)
            contiguous = batch * max(reservation, kv_math.request_kv_bytes(layers, context))
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
