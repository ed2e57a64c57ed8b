"""``kvplan profile --plots DIR``: PNGs of a traffic profile (matplotlib, imported here only).

- ``lengths.png``: histograms of the input and output lengths, tokens;
- ``arrivals.png``: requests arriving per second over the log's time, s from its first arrival;
- ``prefix_reuse.png``: by block position, the share of the requests reaching that block whose
  block there was reused (kvplan.profile.stats.PrefixStats.reuse_by_block).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvplan.profile.stats import TrafficProfile


def write_plots(profile: TrafficProfile, folder: str | Path) -> list[Path]:
    """The three PNGs in ``folder`` (made if missing); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        from kvplan.errors import KvplanError

        raise KvplanError(
            "plots", f"cannot make the folder {out} ({err.strerror or err})", "give a folder path"
        ) from None
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, values, side in zip(axes, (profile.input_tokens, profile.output_tokens), ("input", "output")):
        ax.hist(values, bins=min(60, max(5, len(np.unique(values)))), color="#4c72b0")
        ax.set_xlabel(f"{side} tokens")
        ax.set_ylabel("requests")
    fig.tight_layout()
    paths.append(out / "lengths.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 3.5))
    t = profile.arrivals_s - profile.arrivals_s[0]
    ax.hist(t, bins=max(1, min(200, int(np.ceil(t[-1])) or 1)), color="#55a868")
    ax.set_xlabel("time since the first arrival, s")
    ax.set_ylabel("arrivals per bin")
    fig.tight_layout()
    paths.append(out / "arrivals.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 3.5))
    by_block = profile.prefix.reuse_by_block
    ax.plot(np.arange(len(by_block)), by_block, color="#c44e52")
    ax.set_xlabel(f"block position ({profile.data['block_size']} tokens each)")
    ax.set_ylabel("share reused")
    ax.set_ylim(0, 1.05)
    fig.tight_layout()
    paths.append(out / "prefix_reuse.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
