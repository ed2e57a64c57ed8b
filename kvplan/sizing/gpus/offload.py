"""KV offload tiers in kvplan's arithmetic: each lower tier's capacity in blocks, and the price of
moving blocks over a tier's link (issue 37; the policy: docs/architecture.md, "KV offload tiers").

Capacity: a tier of ``gib`` GiB holds ``int(gib x 2**30) // bytes_per_block`` blocks, the bundled
engine's own rule (engine.offload.storage.build_offload), ``bytes_per_block`` being one device
block's KV over all layers, K and V (kvplan's estimate of the target)::

    host_gib 4, Llama-3.1-8B bf16, blocks of 16 tokens (131,072 B a token x 16 = 2 MiB a block)
      -> int(4 x 2**30) // 2,097,152 = 2,048 blocks

Transfer price (a step's loads; docs/simulate.md, "KV offload tiers"): each tier's link
(device <-> host: the GPU system's host link, kvplan/sizing/data/gpus.yaml ``host_link``; host <->
disk: an NVMe drive) moves the blocks the step loads from that tier; the loads of one step start
together and share the link's bandwidth, so the tier's blocks cost ``setup + bytes / bandwidth``
with ``bytes`` summed over them (kvplan.sizing.gpus.links.SharedLink: n transfers of b bytes
started together all end at setup + n b / bandwidth). A disk load crosses both links (disk ->
host, then host -> device), one after the other. The loads are on the admitting step's critical
path: their seconds are added to its time. Stores are asynchronous (off the step's time).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.sizing.gpus.links import Link

GIB = 2**30  # bytes per GiB, as engine.config.GIB


def tier_blocks(gib: float | None, bytes_per_block: int) -> int:
    """Blocks a tier of ``gib`` GiB holds: ``int(gib x 2**30) // bytes_per_block`` (the engine's
    rule; 0 for None: no such tier). The caller checks that a given tier holds at least one.

    Raises:
        ValueError: ``bytes_per_block`` below 1.
    """
    if bytes_per_block < 1:
        raise ValueError(f"bytes_per_block must be >= 1 (got {bytes_per_block})")
    return 0 if gib is None else int(gib * GIB) // bytes_per_block


@dataclass(frozen=True)
class TierLinks:
    """The links a step's loads cross: ``host`` (device <-> host memory) and ``disk`` (host <->
    the disk tier's drive); ``bytes_per_block`` the unit moved."""

    host: Link
    disk: Link
    bytes_per_block: int

    def describe(self) -> str:
        """One line: the links and their figures (the cost model's description)."""
        h, d = self.host, self.disk
        return (
            f"offload loads over {h.name} ({h.bytes_per_s / 1e9:g} GB/s, {h.setup_s * 1e6:g} us setup)"
            f" and {d.name} ({d.bytes_per_s / 1e9:g} GB/s, {d.setup_s * 1e6:g} us setup)"
        )

    def load_seconds(self, host_blocks: int, disk_blocks: int) -> float:
        """Seconds a step's loads add to it: ``host_blocks`` from the host tier and ``disk_blocks``
        from the disk tier, all started when the step starts (the module docstring)::

            disk leg:  disk.setup + disk_blocks x bytes_per_block / disk.bandwidth   (0 if none)
            host leg:  host.setup + (host_blocks + disk_blocks) x bytes_per_block / host.bandwidth
            seconds = disk leg + host leg (a disk block reaches the device through host memory)

        Example: 2 host blocks of 1 MiB over a 25 GB/s link with 10 us setup: 10e-6 + 2 x 1,048,576 /
        25e9 = 93.9 us.
        """
        if host_blocks < 0 or disk_blocks < 0:
            raise ValueError(f"block counts must be >= 0 (got {host_blocks}, {disk_blocks})")
        seconds = 0.0
        if disk_blocks:
            seconds += self.disk.seconds(disk_blocks * self.bytes_per_block)
        if host_blocks or disk_blocks:
            seconds += self.host.seconds((host_blocks + disk_blocks) * self.bytes_per_block)
        return seconds


DISK_LINK = "nvme-gen4"  # the disk tier's drive where a target names none (kvplan/sizing/data/links.yaml)


def tier_links(gpu: str, bytes_per_block: int, disk: str = DISK_LINK) -> TierLinks:
    """The links a KV offload on ``gpu`` (a name of the GPU table) moves blocks over: its system's
    ``host_link`` (kvplan/sizing/data/gpus.yaml) and the drive ``disk`` (a name of links.yaml).

    Raises:
        KvplanError: an unknown GPU or link (``gpu``, ``disk_link``), or a GPU without a host link.
    """
    from kvplan.errors import KvplanError
    from kvplan.sizing.gpus.gpus import canonical_gpu, gpu_table
    from kvplan.sizing.gpus.links import lookup_link

    name = canonical_gpu(gpu)
    host = gpu_table()[name].get("host_link")
    if host is None:
        raise KvplanError("gpu", f"{name} has no host link in the GPU table", "add its host_link to gpus.yaml")
    return TierLinks(lookup_link(host, "host_link"), lookup_link(disk, "disk_link"), bytes_per_block)


MACHINE_LINKS = ("cpu-host-load", "cpu-disk-read")  # links.yaml: this machine's fitted copies


def machine_tier_links(bytes_per_block: int) -> TierLinks:
    """The bundled engine's own loads on this project's CPU machine (links.yaml ``cpu-host-load``:
    a host slot read and written into the pool; ``cpu-disk-read``: a disk slot read), fitted as
    setup + bytes / bandwidth by bench/offload_copy_fit.py (date and machine in their sources)."""
    from kvplan.sizing.gpus.links import lookup_link

    host, disk = (lookup_link(name) for name in MACHINE_LINKS)
    return TierLinks(host, disk, bytes_per_block)
