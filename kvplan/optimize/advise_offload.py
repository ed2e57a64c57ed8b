"""``kvplan advise``'s offload alternatives (issue 37): a host-memory KV tier, and a disk tier, below
the device pool (the bundled engine's tiers, docs/architecture.md "KV offload tiers", which
``kvplan simulate`` runs on the same policy; on a GPU target each load is priced over the system's
host link or NVMe, kvplan.sizing.gpus.offload).

A tier is a second level of the prefix cache, so the alternatives are offered only with prefix
caching on. Sizes, per engine instance: host ``HOST_TIMES`` x the device pool's bytes, disk
``DISK_TIMES`` x (a tier that holds a few times the pool is the usual production setting; vLLM's
offloading connector and LMCache size the CPU tier in GiB per instance, tens to hundreds). A
workload that has a tier already gets it simulated away (``removes``). A simulated disk tier's
``disk_path`` is never written (the simulator keeps books only); the temp directory stands in.

The verdict is the other alternatives' (kvplan.optimize.advise.verdict), and its reason adds, per
tier, the blocks stored into it (evicted from the pool, or from host to disk), the blocks loaded
back and the prefix-hit tokens it served at each bucket's top level. A tier that gave back fewer
than ``NO_RETURN`` of the blocks stored into it is ``not worth it`` whatever else moved: it costs
memory and bandwidth and almost nothing comes back.
"""

from __future__ import annotations

import tempfile
from typing import Any

from kvplan.results.stats.offload import OffloadSummary
from kvplan.workload.admission import OffloadSettings
from kvplan.workload.schema import Workload

HOST_TIMES = 4  # host tier = 4 x the device pool's bytes
DISK_TIMES = 16  # disk tier = 16 x
NO_RETURN = 0.01  # loads / stores below this: nothing comes back


def _gib(num_bytes: float) -> float:
    """Bytes as GiB, rounded up to two significant digits."""
    gib = num_bytes / 2**30
    digits = max(0, 1 - int(f"{gib:e}".split("e")[1]))
    step = 10.0**-digits
    return round(-(-gib // step) * step, digits)


def offload_changes(workload: Workload, pool_bytes: int) -> list[tuple[str, str, dict[str, Any], bool]]:
    """(name, change, engine update, removes) per tier: ``host offload N GiB`` and ``disk offload
    N GiB`` (module docstring); none with prefix caching off. ``pool_bytes``: the device pool's
    bytes per engine instance (blocks x bytes per block)."""
    engine = workload.engine
    if not engine.enable_prefix_caching:
        return []
    have = engine.offload
    out = []
    for tier, times in (("host", HOST_TIMES), ("disk", DISK_TIMES)):
        size = getattr(have, f"{tier}_gib")
        if size is not None:  # the workload has it: simulate it away
            fields = have.model_dump() | {f"{tier}_gib": None} | ({"disk_path": None} if tier == "disk" else {})
            change = f"offload.{tier}_gib: null (it is {size:g} GiB: simulated without)"
            out.append((f"{tier} offload {size:g} GiB", change, {"offload": OffloadSettings(**fields)}, True))
            continue
        gib = _gib(times * pool_bytes)
        fields = have.model_dump() | {f"{tier}_gib": gib}
        if tier == "disk":
            fields["disk_path"] = tempfile.gettempdir()
        change = f"offload.{tier}_gib: {gib:g} ({times} x the pool's {pool_bytes / 2**30:.3g} GiB)"
        out.append((f"{tier} offload {gib:g} GiB", change, {"offload": OffloadSettings(**fields)}, False))
    return out


def tier_figures(tier: str, summaries: list[tuple[str, OffloadSummary | None]]) -> tuple[str, float | None]:
    """The reason's words for ``tier`` over each (bucket, its top level's OffloadSummary), and the
    share of blocks stored into the tier that were loaded back (None: nothing stored)."""
    said, stored, loaded = [], 0, 0
    for name, s in summaries:
        if s is None:
            said.append(f"{name}: the {tier} tier never held a block")
            continue
        st, ld = getattr(s, f"num_{tier}_stores"), getattr(s, f"num_{tier}_loads")
        hits = getattr(s, f"num_{tier}_hit_tokens")
        total = s.device_hit_tokens + s.num_host_hit_tokens + s.num_disk_hit_tokens
        share = f"{ld / st:.0%}" if st else "-"
        of_hits = f" ({hits / total:.0%} of prefix hits)" if total else ""
        said.append(
            f"{name}: {st:,} blocks evicted into the {tier} tier, {ld:,} loaded back ({share}),"
            f" {hits:,} prefix-hit tokens from it{of_hits}"
        )
        stored, loaded = stored + st, loaded + ld
    return "; ".join(said), (loaded / stored if stored else None)
