"""A level's KV offload tiers (the bundled engine's engine.offload): prefix hits by tier, stores,
loads and bytes moved, summed over its step records, and the most blocks each lower tier held.

The step fields are engine.outputs.StepStats' (``num_host_stores``, ``num_disk_hit_tokens``, ...;
0 in runs recorded before they existed or with offload off). The pool's own hits are the level's
prefix-hit tokens less the host's and the disk's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from kvplan.results.rows import column
from kvplan.results.stats.latency import _Summary

SUMMED = (
    "num_host_hit_tokens",
    "num_disk_hit_tokens",
    "num_host_stores",
    "num_disk_stores",
    "num_host_loads",
    "num_disk_loads",
    "offload_bytes_stored",
    "offload_bytes_loaded",
)


class OffloadSummary(_Summary):
    """One level's offload tiers, over its steps (sums, except the peaks)."""

    device_hit_tokens: int = Field(description="Prefix-hit tokens served by the device pool itself, tokens.")
    num_host_hit_tokens: int = Field(description="Prefix-hit tokens loaded back from the host tier, tokens.")
    num_disk_hit_tokens: int = Field(description="Prefix-hit tokens loaded back from the disk tier, tokens.")
    num_host_stores: int = Field(description="KV blocks stored into the host tier (evicted from the pool).")
    num_disk_stores: int = Field(description="KV blocks stored into the disk tier (evicted from host, or the pool).")
    num_host_loads: int = Field(description="KV blocks loaded back to the pool from the host tier.")
    num_disk_loads: int = Field(description="KV blocks loaded back to the pool from the disk tier.")
    offload_bytes_stored: int = Field(description="Bytes stored into lower tiers (blocks x bytes per block).")
    offload_bytes_loaded: int = Field(description="Bytes loaded back to the pool (blocks x bytes per block).")
    peak_host_blocks: int = Field(description="The most blocks the host tier held after a step.")
    peak_disk_blocks: int = Field(description="The most blocks the disk tier held after a step.")


def offload_summary(steps: Sequence[Any]) -> OffloadSummary | None:
    """The level's OffloadSummary from its step records; None when no step shows a lower tier
    holding or moving anything (offload off, or a run recorded before it existed)."""
    sums = {name: sum(column(steps, name, 0)) for name in SUMMED}
    peaks = {f"peak_{t}_blocks": max(column(steps, f"num_{t}_blocks", 0), default=0) for t in ("host", "disk")}
    if not any(sums.values()) and not any(peaks.values()):
        return None
    hits = sum(column(steps, "num_prefix_hit_tokens"))
    return OffloadSummary(
        device_hit_tokens=hits - sums["num_host_hit_tokens"] - sums["num_disk_hit_tokens"], **sums, **peaks
    )
