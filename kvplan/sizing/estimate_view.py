"""Console view of a KVEstimate: three rich tables (model, GPU capacity, per-request grid).

Sizes are shown in GiB (2**30 bytes) to 3 decimals; ``--json`` has the exact integer bytes.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kvplan.sizing.estimate import KVEstimate, layer_kind_counts
from kvplan.sizing.kv_math import FullAttentionSpec, MLASpec, SlidingWindowSpec
from kvplan.sizing.models.model_spec import ModelSpec

GiB = 2**30


def _gib(num_bytes: int | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / GiB:,.3f}"


def _attention(result: KVEstimate) -> str:
    """The first attention layer's shape, then how many cache layers of each kind the rank holds."""
    layers = result.layers
    first = next((layer for layer in layers if isinstance(layer, (FullAttentionSpec, MLASpec))), None)
    if isinstance(first, MLASpec):
        text = f"MLA, latent {first.kv_lora_rank} + rope {first.qk_rope_head_dim}"
    elif first is None:
        text = "no attention layers"
    else:
        heads = first.num_kv_heads
        width = f"head_dim {first.head_dim}"
        if first.v_head_dim not in (None, first.head_dim):
            width = f"K {first.head_dim} + V {first.v_head_dim}"
        text = f"{heads} KV head{'s' if heads > 1 else ''} x {width} per rank"
    counts = layer_kind_counts(layers)
    if len(counts) > 1 or "sliding" in counts:
        text += "; " + ", ".join(f"{n} {kind}" for kind, n in counts.items())
        sliding = next((layer for layer in layers if isinstance(layer, SlidingWindowSpec)), None)
        if sliding is not None:
            text += f" (window {sliding.sliding_window:,})"
    return text


def render_estimate(result: KVEstimate, spec: ModelSpec, console: Console | None = None) -> None:
    """Print the model, capacity and grid tables."""
    console = console or Console()
    cap = result.capacity
    model = Table(title=f"{cap.model}: KV per token", show_header=False, title_justify="left")
    model.add_row("cache layers (this rank)", f"{len(result.layers)} for {spec.num_layers} model layers")
    model.add_row("attention", _attention(result))
    model.add_row("KV dtype / tp / pp", f"{cap.kv_cache_dtype} / {cap.tp} / {cap.pp}")
    model.add_row("bytes per token", f"{cap.bytes_per_token:,} per rank, {cap.bytes_per_token_all_ranks:,} all ranks")
    model.add_row("bytes per block", f"{cap.bytes_per_block:,} ({cap.block_size} tokens)")
    if cap.per_request_state_bytes:
        dtypes = " / ".join(f"{part} {name}" for part, name in (cap.state_dtype or {}).items())
        model.add_row("fixed state per request", f"{cap.per_request_state_bytes:,} bytes ({dtypes})")
    model.add_row(
        f"one {cap.max_model_len:,}-token request",
        f"{_gib(cap.per_request_bytes)} GiB paged" + (" with its state" if cap.per_request_state_bytes else ""),
    )
    if cap.num_parameters is not None:
        model.add_row(
            "parameters / weights per rank", f"{cap.num_parameters / 1e9:,.2f} B / {_gib(cap.weights_bytes)} GiB"
        )
    console.print(model)

    if cap.kv_budget_bytes is not None:
        gpu = Table(
            title=f"Capacity per GPU{f' ({cap.gpu})' if cap.gpu else ''}", show_header=False, title_justify="left"
        )
        if cap.gpu_memory_bytes is not None:
            gpu.add_row("GPU memory", f"{_gib(cap.gpu_memory_bytes)} GiB")
        if cap.overhead_bytes is not None:  # the budget was computed, not given as --kv-memory-gib
            gpu.add_row("weights + overhead", f"{_gib(cap.weights_bytes)} + {_gib(cap.overhead_bytes)} GiB")
        gpu.add_row("KV budget", f"{_gib(cap.kv_budget_bytes)} GiB")
        if cap.num_blocks is not None:
            gpu.add_row("blocks", f"{cap.num_blocks:,}")
            gpu.add_row("KV capacity", f"{cap.kv_capacity_tokens:,} tokens")
        gpu.add_row(f"max concurrency at {cap.max_model_len:,} tokens", f"{cap.max_concurrency:,.2f}")
        if cap.max_model_len_fit is not None:
            gpu.add_row("largest max_model_len that fits", f"[red]{cap.max_model_len_fit:,}[/red] tokens")
        console.print(gpu)

    grid = Table(
        title="Per batch (GiB per rank)",
        title_justify="left",
        caption="needed: the tokens' KV; paged: whole blocks; contig.: max_model_len reserved per request;"
        " waste: minus needed",
        caption_justify="left",
    )
    for header in ("context", "batch", "needed", "paged", "waste", "contig.", "waste", "fits"):
        grid.add_column(header, justify="right")
    for row in result.grid:
        if row.exceeds_max_model_len:
            fits = "[red]no: over max_model_len[/red]"
        else:
            fits = "-" if row.fits is None else ("yes" if row.fits else "[red]no[/red]")
        grid.add_row(
            f"{row.context_tokens:,}{'*' if row.exceeds_max_model_len else ''}",
            str(row.batch_size),
            _gib(row.kv_bytes),
            _gib(row.paged_bytes),
            _gib(row.paged_waste_bytes),
            _gib(row.contiguous_bytes),
            _gib(row.contiguous_waste_bytes),
            fits,
        )
    console.print(grid)
    if any(row.exceeds_max_model_len for row in result.grid):
        console.print(
            f"* longer than max_model_len {cap.max_model_len:,}: a server refuses such a request; "
            "the sizes show what it would need"
        )
    if result.shared_prefix_tokens:
        console.print(f"shared prefix: {result.shared_prefix_tokens:,} tokens, full blocks stored once per batch")
