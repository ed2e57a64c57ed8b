"""Console view of a LlamaCppKV: one rich table of llama.cpp's KV buffer, per cache and in all.

MiB are printed as llama.cpp prints them (2 decimals of bytes / 2**20), so the table can be read
beside llama-server's start-up lines; ``--json`` has the exact integer bytes.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kvplan.sizing.llamacpp import LlamaCppKV


def render_llamacpp(result: LlamaCppKV, console: Console) -> None:
    """Print the buffer: context and slots, then each cache's cells, layers, K and V bytes."""
    table = Table(title=f"{result.model}: llama.cpp KV buffer", title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("", justify="right")
    layout = "unified, 1 stream for all slots" if result.kv_unified else f"per slot, {result.n_parallel} streams"
    table.add_row("n_ctx (padded to 256)", f"{result.n_ctx:,} cells")
    table.add_row("slots / KV layout", f"{result.n_parallel} / {layout}")
    table.add_row("longest context per slot", f"{result.n_ctx_seq:,} tokens")
    table.add_row("cache type K / V", f"{result.cache_type_k} / {result.cache_type_v}")
    for cache in result.caches:
        name = "SWA" if cache.kind == "sliding" else "non-SWA" if len(result.caches) > 1 else "KV"
        table.add_row(
            f"{name} cache",
            f"{cache.cells:,} cells x {cache.num_streams} x {cache.num_layers} layers: K {cache.k_bytes:,}"
            f" + V {cache.v_bytes:,} bytes = {cache.mib:.2f} MiB",
        )
    table.add_row("KV buffer", f"{result.bytes:,} bytes = {result.bytes / 2**20:.2f} MiB")
    console.print(table)
    if result.num_full_window_layers:
        console.print(
            f"{result.num_full_window_layers} sliding-window layers are priced full: llama.cpp runs this"
            " model's architecture without its sliding window"
        )
    if result.num_recurrent_layers:
        console.print(
            f"{result.num_recurrent_layers} recurrent layers keep their state in llama.cpp's separate"
            " recurrent buffer (f32), not counted here"
        )
