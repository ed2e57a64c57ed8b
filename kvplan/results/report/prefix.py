"""The prefix-caching views of a shared_prefix run: summary.md's section, its table and charts;
and, for a run with KV offload tiers (engine.offload), the prefix hits by tier (``offload_markdown``).

Present only when the run result has ``prefix_caching`` (kvplan.results.stats.prefix_metrics.compare_variants):
TTFT with caching effective against defeated per level, the prefix hit rate per level and per
step, and peak KV against kvplan's paged estimate with and without the prefix counted once.
Charts follow kvplan.results.report.plots: one ``plot_*(ax, data)`` each, "no data" instead of failing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from kvplan.results.metrics import LevelSummary
from kvplan.results.records import LevelKey
from kvplan.results.report import tables
from kvplan.results.report.plots import MIB, gaps, level_axis, no_data
from kvplan.results.run_result import RunResult
from kvplan.results.stats.prefix_metrics import CACHED, UNCACHED, PrefixComparison, hit_rate

if TYPE_CHECKING:  # matplotlib loads only where a chart is drawn
    from matplotlib.axes import Axes

VARIANT_COLORS = {CACHED: "tab:blue", UNCACHED: "tab:red"}


def prefix_table(result: RunResult) -> pd.DataFrame:
    """Per level: hit rate and TTFT P50/P95 (ms), cached vs uncached."""
    rows = [
        {
            "bucket": row.bucket,
            "level": row.key.label,
            "hit rate": row.prefix_hit_rate_cached,
            "TTFT P50 cached": row.ttft_p50_ms_cached,
            "TTFT P50 uncached": row.ttft_p50_ms_uncached,
            "TTFT P95 cached": row.ttft_p95_ms_cached,
            "TTFT P95 uncached": row.ttft_p95_ms_uncached,
            "P50 speedup": row.ttft_p50_speedup,
        }
        for row in result.prefix_caching or []
    ]
    return pd.DataFrame(rows)


def prefix_kv_table(result: RunResult) -> pd.DataFrame:
    """Per level: KV (MiB) of the cached variant, estimated with and without the prefix counted
    once against measured (peak, and mean per step), and the uncached variant's measured KV."""
    mib = tables._mib  # noqa: SLF001 (the same unit as the report's other tables)
    rows = [
        {
            "bucket": row.bucket,
            "level": row.key.label,
            "peak paged est.": mib(row.peak_paged_bytes),
            "peak est., prefix once": mib(row.peak_shared_estimate_bytes),
            "peak measured": mib(row.peak_measured_bytes_cached),
            "mean paged est.": mib(row.mean_paged_bytes),
            "mean est., prefix once": mib(row.mean_shared_estimate_bytes),
            "mean measured": mib(row.mean_measured_bytes_cached),
            "uncached: peak measured": mib(row.peak_measured_bytes_uncached),
            "uncached: mean measured": mib(row.mean_measured_bytes_uncached),
        }
        for row in result.prefix_caching or []
    ]
    return pd.DataFrame(rows)


def prefix_markdown(result: RunResult) -> list[str]:
    """summary.md's section ([] for a run without a shared prefix)."""
    info = result.estimate.shared_prefix if result.estimate else None
    if result.prefix_caching is None or info is None:
        return []
    sources = (result.run.dataset.get("shared_prefix") or {}).get("sources", [])
    return [
        "",
        "## Prefix caching: with against without, one run, one engine",
        "",
        f"- Shared prefix: {info.num_tokens:,} tokens ({info.num_full_blocks} full blocks,"
        f" {info.shared_bytes_per_request / MIB:,.2f} MiB of KV), {info.num_prefixes} distinct"
        f" prefix(es) ({', '.join(dict.fromkeys(sources)) or '?'}), carried by {info.fraction:.0%} of the"
        f" requests, {info.num_tenants} tenant(s).",
        "- Every level ran twice on the same prompts: **cached** (one cache salt per tenant, so a"
        " group's requests share its prefix blocks) then **uncached** (one salt per request, so no block"
        " is shared). Hit rate = prompt tokens served from the prefix cache / prompt tokens looked up"
        " at admission (cached variant; the uncached one is 0 by construction).",
        "",
        tables.to_markdown(prefix_table(result)).rstrip("\n"),
        "",
        "KV of the cached variant (MiB): kvplan's paged estimate; the same with the prefix's full"
        " blocks counted once, i.e. minus (k - 1) x their bytes for every group and tenant with k"
        " requests holding them at that step (the ideal: requests admitted in the same step each"
        " compute their own copy, so measured lies between the two); measured. Means are per step,"
        " over the steps whose requests the records place (all, without preemption).",
        "",
        tables.to_markdown(prefix_kv_table(result)).rstrip("\n"),
    ]


def offload_table(result: RunResult) -> pd.DataFrame:
    """Per level of a run with offload tiers: prefix-hit tokens by tier (device pool, host, disk),
    blocks stored into and loaded from each lower tier, MiB moved each way, the most blocks each
    held; empty when no level used a lower tier and the workload set none."""
    engine = result.workload.config.get("engine")
    offload = engine.get("offload") if isinstance(engine, dict) else None
    configured = isinstance(offload, dict) and any(v is not None for v in offload.values())
    if not configured and not any(lv.offload for lv in result.levels):
        return pd.DataFrame()
    rows = []
    for lv in result.levels:
        o = lv.offload
        rows.append(
            {
                "bucket": lv.bucket,
                "level": tables.level_name(lv),
                "hit tok device": o.device_hit_tokens if o else None,
                "hit tok host": o.num_host_hit_tokens if o else 0,
                "hit tok disk": o.num_disk_hit_tokens if o else 0,
                "stores host": o.num_host_stores if o else 0,
                "stores disk": o.num_disk_stores if o else 0,
                "loads host": o.num_host_loads if o else 0,
                "loads disk": o.num_disk_loads if o else 0,
                "MiB stored": (o.offload_bytes_stored if o else 0) / MIB,
                "MiB loaded": (o.offload_bytes_loaded if o else 0) / MIB,
                "peak blocks host": o.peak_host_blocks if o else 0,
                "peak blocks disk": o.peak_disk_blocks if o else 0,
            }
        )
    return pd.DataFrame(rows)


def offload_markdown(result: RunResult) -> list[str]:
    """summary.md's offload section ([] for a run without offload tiers)."""
    frame = offload_table(result)
    if frame.empty:
        return []
    return [
        "",
        "## KV offload tiers: prefix hits by tier",
        "",
        "Prefix-hit tokens by the tier that served them (device: the pool's own prefix cache; host, disk:"
        " blocks the pool had evicted, loaded back instead of recomputed). Stores: cached blocks evicted"
        " into a tier (from the pool, or host to disk); loads: blocks copied back to the pool. Sums over"
        " the level's steps (docs/architecture.md, KV offload tiers).",
        "",
        tables.to_markdown(frame).rstrip("\n"),
    ]


def plot_ttft_with_without(ax: Axes, rows: Sequence[PrefixComparison]) -> None:
    """TTFT P50 (solid) and P95 (dashed) against the load level, cached vs uncached, per bucket."""
    ax.set_title("TTFT with vs without prefix caching")
    rows = [r for r in rows if r.ttft_p50_ms_cached is not None or r.ttft_p50_ms_uncached is not None]
    if not rows:
        return no_data(ax, "no level completed a request")
    markers = dict(zip(dict.fromkeys(r.bucket for r in rows), "osD^v"))
    for bucket, marker in markers.items():
        own = [r for r in rows if r.bucket == bucket]
        for variant, color in VARIANT_COLORS.items():
            for pct, style in (("p50", "-"), ("p95", "--")):
                key = f"ttft_{pct}_ms_{variant}"
                points = [(r.level, getattr(r, key)) for r in own if getattr(r, key) is not None]
                if points:
                    label = f"{bucket} {variant} {pct.upper()}" if len(markers) > 1 else f"{variant} {pct.upper()}"
                    ax.plot(*zip(*points), style, marker=marker, color=color, label=label)
    level_axis(ax, [r.level for r in rows])
    ax.set_xlabel("concurrency (requests in flight)" if rows[0].mode == "closed" else "load level")
    ax.set_ylabel("TTFT (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)


def plot_prefix_kv(ax: Axes, rows: Sequence[PrefixComparison]) -> None:
    """KV per level (MiB): bars the mean per step, black ticks the peak. The cached variant's
    paged estimate, paged estimate with the prefix once and measured KV; the uncached variant's
    measured KV (equal to its paged estimate)."""
    ax.set_title("KV per level: estimates vs measured (bar: mean per step, tick: peak)")
    if not rows:
        return no_data(ax, "no level ran in both variants")
    series = (
        ("paged_bytes", "cached: paged estimate", "tab:orange"),
        ("shared_estimate_bytes", "cached: paged estimate, prefix once", "tab:green"),
        ("measured_bytes_cached", "cached: measured", VARIANT_COLORS[CACHED]),
        ("measured_bytes_uncached", "uncached: measured", VARIANT_COLORS[UNCACHED]),
    )
    width = 0.8 / len(series)
    for i, (key, label, color) in enumerate(series):
        for stat in ("mean", "peak"):
            shown = [
                (j + i * width, getattr(r, f"{stat}_{key}") / MIB)
                for j, r in enumerate(rows)
                if getattr(r, f"{stat}_{key}") is not None
            ]
            if not shown:
                continue
            xs, values = zip(*shown)
            if stat == "mean":
                ax.bar(xs, values, width, label=label, color=color)
            else:
                ax.scatter(xs, values, marker="_", s=260, color="black", label="peak" if i == 0 else None)
    names = [f"{r.bucket}\n{r.key.label}" for r in rows]
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], names, fontsize=7)
    ax.set_ylabel("KV (MiB)")
    ax.legend(fontsize=8)


def plot_prefix_hit_rate(ax: Axes, steps: Sequence[Any], levels: Sequence[LevelSummary]) -> None:
    """Per step that admitted requests, its prefix hit rate (dots) against time since the first
    step; per level, the level's hit rate over its steps (a line across the level)."""
    ax.set_title("Prefix cache hit rate: per step (admissions) and per level")
    looked_up = [s for s in steps if s.num_prefix_queried_tokens]
    if not looked_up:
        return no_data(ax, "no step looked up the prefix cache (prefix caching off?)")
    t0 = steps[0].start_time
    spans: dict[LevelKey, list[float]] = {}
    for s in steps:
        spans.setdefault(s.key, []).append(s.end_time - t0)
    for variant, color in VARIANT_COLORS.items():
        own = [s for s in looked_up if s.variant == variant]
        if own:
            ax.scatter(
                [s.end_time - t0 for s in own],
                gaps(hit_rate(s.num_prefix_hit_tokens, s.num_prefix_queried_tokens) for s in own),
                s=10,
                color=color,
                label=f"step, {variant}",
            )
    for lv in levels:
        times = spans.get(lv.key)
        if times and lv.prefix_hit_rate is not None:
            color = VARIANT_COLORS.get(lv.variant, "0.3")
            ax.hlines(lv.prefix_hit_rate, min(times), max(times), color=color, linewidth=2.5, alpha=0.6)
            ax.axvline(min(times), color="0.85", linewidth=0.8, zorder=0)
            ax.text(
                min(times), 1.5, f"{lv.bucket} {tables.level_name(lv)}", fontsize=7, rotation=90, va="top", color="0.4"
            )
    ax.plot([], [], color="0.3", linewidth=2.5, alpha=0.6, label="level (hit / looked-up tokens)")
    ax.set_ylim(-0.03, 1.55)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xlabel("time since first step (s)")
    ax.set_ylabel("hit rate (prompt tokens)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)


TIER_COLORS = {"device": "tab:blue", "host": "tab:orange", "disk": "tab:brown"}


def plot_hits_by_tier(ax: Axes, levels: Sequence[LevelSummary]) -> None:
    """Per level of a run with offload tiers, its prefix-hit tokens stacked by the tier that
    served them (device pool, host, disk)."""
    ax.set_title("Prefix-hit tokens by tier (KV offload)")
    rows = [lv for lv in levels if lv.offload is not None]
    if not rows:
        return no_data(ax, "no level used a lower tier")
    bottom = [0] * len(rows)
    for tier, color in TIER_COLORS.items():
        key = "device_hit_tokens" if tier == "device" else f"num_{tier}_hit_tokens"
        values = [getattr(lv.offload, key) for lv in rows]
        ax.bar(range(len(rows)), values, 0.6, bottom=bottom, color=color, label=tier)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(rows)), [f"{lv.bucket}\n{tables.level_name(lv)}" for lv in rows], fontsize=7)
    ax.set_ylabel("prefix-hit tokens")
    ax.legend(fontsize=8)
