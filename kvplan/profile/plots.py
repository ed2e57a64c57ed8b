"""``kvplan profile --plots DIR``: PNGs of a traffic profile (matplotlib, imported here only).

- ``lengths.png``: histograms of the input and output lengths, tokens;
- ``arrivals.png``: requests arriving per second over the log's time, s from its first arrival;
- ``prefix_reuse.png``: by block position, the share of the requests reaching that block whose
  block there was reused (kvplan.profile.stats.PrefixStats.reuse_by_block);
- ``load.png``: requests arriving per minute over the log's time (kvplan.profile.load), its P99
  and peak minute marked, and, for a log over two hours, each hour's mean per minute.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvplan.profile.load import HOUR_S, MAX_DENSE, MINUTE_S, window_counts
from kvplan.profile.stats import TrafficProfile


def write_plots(profile: TrafficProfile, folder: str | Path) -> list[Path]:
    """The four PNGs in ``folder`` (made if missing); returns their paths."""
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

    paths.append(out / "load.png")
    _load_plot(plt, profile, paths[-1])
    return paths


def _load_plot(plt, profile: TrafficProfile, path: Path) -> None:
    load = profile.data["load"]
    hourly = load["num_hours"] is not None
    scale, unit = (60.0, "hours") if hourly else (1.0, "minutes")
    fig, ax = plt.subplots(figsize=(10, 3.5))
    if load["num_minutes"] <= MAX_DENSE:
        busy, counts, total = window_counts(profile.arrivals_s, MINUTE_S)
        dense = np.zeros(total)
        dense[busy] = counts
        ax.plot(np.arange(total) / scale, dense, color="#4c72b0", linewidth=0.6, label="per minute")
    if hourly:  # the last hour is cut at the last arrival, and its mean taken over what it covers
        busy, counts, total = window_counts(profile.arrivals_s, HOUR_S)
        per_minute = np.zeros(total)
        per_minute[busy] = counts / 60
        span_h = float(profile.arrivals_s[-1] - profile.arrivals_s[0]) / HOUR_S
        per_minute[-1] /= max(span_h - (total - 1), 1 / 60)
        edges = np.append(np.arange(total), span_h)
        ax.step(
            edges, np.append(per_minute, per_minute[-1]), where="post", color="#dd8452", label="hour's mean per minute"
        )
    ax.axhline(
        load["p99_per_minute"],
        color="#c44e52",
        linestyle="--",
        linewidth=0.8,
        label=f"P99 minute {load['p99_per_minute']:.4g}",
    )
    ax.axhline(
        load["peak_per_minute"],
        color="#8172b3",
        linestyle=":",
        linewidth=0.8,
        label=f"peak minute {load['peak_per_minute']}",
    )
    ax.set_xlabel(f"time since the first arrival, {unit}")
    ax.set_ylabel("requests per minute")
    ax.legend(loc="best", fontsize=8, framealpha=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
