"""`kvplan estimate --plot`: paged KV GiB against context length, one line per batch size.

Both axes are logarithmic: KV grows linearly with context (a fixed state per request adds a
floor), which a log-log chart shows as straight lines of slope 1, and it keeps 1k and 1M tokens
readable on one chart. The KV budget is a horizontal line, max_model_len a vertical one.
Imported only when --plot is given (matplotlib is slow to import). Agg backend, no display.
"""

from __future__ import annotations

from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.sizing import kv_math
from kvplan.sizing.estimate import KVEstimate

GiB = 2**30


def plot_kv_vs_context(ax, result: KVEstimate) -> None:
    """Draw paged KV (GiB per rank, fixed states included) against context on log-log axes, 64
    log-spaced points from one block to the longest grid context or max_model_len, one line per
    batch size; the KV budget as a horizontal line and max_model_len as a vertical one."""
    import numpy as np

    cap = result.capacity
    longest = max(max(row.context_tokens for row in result.grid), cap.max_model_len)
    contexts = np.unique(np.geomspace(cap.block_size, max(longest, cap.block_size * 2), 64).astype(int))
    for batch in sorted({row.batch_size for row in result.grid}):
        gib = [
            kv_math.batch_kv_bytes(
                result.layers, int(n), batch, cap.block_size, min(result.shared_prefix_tokens, int(n))
            )
            / GiB
            for n in contexts
        ]
        ax.plot(contexts, gib, label=f"batch {batch}")
    if cap.kv_budget_bytes is not None:
        pool = cap.kv_budget_bytes if cap.num_blocks is None else cap.num_blocks * cap.bytes_per_block
        ax.axhline(pool / GiB, color="red", linestyle="--", label=f"KV budget {pool / GiB:,.2f} GiB")
    else:
        ax.text(0.02, 0.95, "no KV budget (give --gpu or --kv-memory-gib)", transform=ax.transAxes, va="top")
    ax.axvline(cap.max_model_len, color="gray", linestyle=":", label=f"max_model_len {cap.max_model_len:,}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens, log scale)")
    ax.set_ylabel("KV cache per GPU rank (GiB, log scale)")
    ax.set_title(f"{cap.model}: paged KV, {cap.kv_cache_dtype}, tp={cap.tp}, block {cap.block_size}")
    ax.grid(True, alpha=0.3)
    ax.legend()


def check_plot_path(path: Path) -> Path:
    """``path`` if a PNG can be written there: a file name ending in .png in an existing folder.

    Raises:
        KvplanError: a folder, another (or no) extension, or a missing parent folder.
    """
    path = Path(path)
    if path.is_dir():
        raise KvplanError("plot", f"{path} is a folder", "give a file path ending in .png, e.g. kv.png")
    if path.suffix.lower() != ".png":
        raise KvplanError("plot", f"must be a .png file (got {str(path)!r})", "give a file path ending in .png")
    if not path.parent.is_dir():
        raise KvplanError("plot", f"folder {path.parent} does not exist")
    return path


def save_estimate_plot(result: KVEstimate, path: Path) -> None:
    """Write the chart to ``path`` (PNG).

    Raises:
        KvplanError: a bad path (see :func:`check_plot_path`) or a file that cannot be written.
    """
    path = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        plot_kv_vs_context(ax, result)
        fig.savefig(path, dpi=100, bbox_inches="tight")
    except OSError as err:
        raise KvplanError("plot", f"cannot write {path}: {err.strerror}") from None
    finally:
        plt.close(fig)
