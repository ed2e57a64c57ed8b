"""The bytes of the offload tiers, for real: a host tensor and a disk file per block pool, and the
start-up checks that turn a tier that cannot work into one ``SettingError`` line at construction.

A block's bytes are the same in every tier: for each layer its K block then ... its V blocks,
``[2 x num_layers, block_bytes_per_layer]`` uint8 (the device tensors viewed as bytes, so every
KV dtype, fp8 included, moves unchanged). The host tier is one uint8 tensor ``[host_blocks, 2 x
num_layers, block_bytes_per_layer]`` (pinned on CUDA); the disk tier one file of ``disk_blocks x
bytes_per_block`` bytes in ``offload_disk_path``, slot s at byte ``s x bytes_per_block``,
reserved at start (posix_fallocate) so a full disk fails there, never mid-run; it is removed when
the engine goes (or the process exits). Copies are synchronous: a store is done during the
scheduling of the step that evicts (before its forward pass rewrites the block), a load before
the forward pass of the step that admits.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence

import torch

from engine.config import GIB, EngineConfig, SettingError
from engine.kv_cache import KVCache, is_oom_error
from engine.offload.tiers import DEVICE, HOST, Offload


class KVMover:
    """Moves block bytes between ``kv_cache``'s device tensors, a host tensor and a disk file.

    Args:
        kv_cache: the pool (its tensors are viewed as bytes, never copied whole).
        host_blocks: slots of the host tensor (0: no host tier).
        disk_fd: an open read-write descriptor of the disk tier's file (None: no disk tier).
    """

    def __init__(self, kv_cache: KVCache, host_blocks: int, disk_fd: int | None):
        self._dev = [t.view(t.shape[0], -1).view(torch.uint8) for t in (*kv_cache.k_caches, *kv_cache.v_caches)]
        self.device = self._dev[0].device
        self._shape = (len(self._dev), self._dev[0].shape[1])  # one block: [2 x layers, bytes per layer]
        self.block_bytes = self._shape[0] * self._shape[1]
        pin = self.device.type == "cuda"
        self.host = torch.empty((host_blocks, *self._shape), dtype=torch.uint8, pin_memory=pin) if host_blocks else None
        self.disk_fd = disk_fd

    def _device_block(self, block_id: int) -> torch.Tensor:
        return torch.stack([d[block_id] for d in self._dev]).cpu()

    def copy(self, src: str, src_index: int, dst: str, dst_index: int) -> None:
        """Copy a block device -> host, device -> disk or host -> disk (synchronously)."""
        data = self._device_block(src_index) if src == DEVICE else self._host()[src_index]
        if dst == HOST:
            self._host()[dst_index].copy_(data)
            return
        assert self.disk_fd is not None
        written = os.pwrite(self.disk_fd, data.contiguous().numpy().tobytes(), dst_index * self.block_bytes)
        if written != self.block_bytes:  # the space was reserved at start: only a failing disk gets here
            raise OSError(errno.EIO, f"disk tier: wrote {written} of {self.block_bytes} bytes")

    def read(self, tier: str, index: int) -> torch.Tensor:
        """A host or disk slot's bytes, [2 x layers, bytes per layer] uint8 on the CPU (a copy)."""
        if tier == HOST:
            return self._host()[index].clone()
        assert self.disk_fd is not None
        raw = os.pread(self.disk_fd, self.block_bytes, index * self.block_bytes)
        if len(raw) != self.block_bytes:
            raise OSError(errno.EIO, f"disk tier: read {len(raw)} of {self.block_bytes} bytes")
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(self._shape)

    def write_device(self, block_ids: Sequence[int], payloads: Sequence[torch.Tensor]) -> None:
        """Write ``payloads`` (from ``read``) into these device blocks, one copy per layer and K/V."""
        if not block_ids:
            return
        stacked = torch.stack(list(payloads)).to(self.device)  # [blocks, 2 x layers, bytes per layer]
        index = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        for i, d in enumerate(self._dev):
            d[index] = stacked[:, i]

    def _host(self) -> torch.Tensor:
        assert self.host is not None
        return self.host


def build_offload(config: EngineConfig, kv_cache: KVCache) -> Offload | None:
    """The lower tiers ``config`` asks for, around ``kv_cache``; None when it asks for none.

    Raises:
        SettingError: ``offload_host_gib`` or ``offload_disk_gib`` below one block (the message
            gives a block's bytes), a host tier that cannot be allocated, ``offload_disk_path``
            not a writable directory, or a disk without room for ``offload_disk_gib``.
    """
    if config.offload_host_gib is None and config.offload_disk_gib is None:
        return None
    per_block = kv_cache.bytes_per_block
    counts = {}
    for field in ("offload_host_gib", "offload_disk_gib"):
        gib = getattr(config, field)
        counts[field] = 0 if gib is None else int(gib * GIB) // per_block
        if gib is not None and counts[field] < 1:
            raise SettingError(field, f"must hold at least one KV block of {per_block:,} bytes (got {gib} GiB)")
    host_blocks, disk_blocks = counts["offload_host_gib"], counts["offload_disk_gib"]
    fd = None if not disk_blocks else _disk_file(config.offload_disk_path or "", disk_blocks * per_block)
    try:
        mover = KVMover(kv_cache, host_blocks, fd)
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if fd is not None:
            _close(fd)
        if not is_oom_error(e):
            raise
        raise SettingError(
            "offload_host_gib", f"a host tier of {host_blocks * per_block:,} bytes cannot be allocated; lower it"
        ) from None
    if fd is not None:  # the file goes with the mover (the engine), or at exit
        weakref.finalize(mover, _close, fd)
    return Offload(host_blocks, disk_blocks, per_block, kv_cache.block_size, mover)


def _disk_file(directory: str, size: int) -> int:
    """A new file of ``size`` bytes reserved in ``directory``, open read-write; removed when the
    descriptor's owner is collected or the process exits. Raises SettingError."""
    if not os.path.isdir(directory):
        raise SettingError("offload_disk_path", f"must be an existing directory (got {directory!r})")
    try:
        fd, path = tempfile.mkstemp(prefix="kvplan-kv-offload-", suffix=".bin", dir=directory)
    except OSError as e:
        raise SettingError(
            "offload_disk_path", f"cannot create a file in {directory}: {e.strerror}; give a writable directory"
        ) from None
    try:
        free = shutil.disk_usage(directory).free
        if free < size:
            raise SettingError(
                "offload_disk_gib", f"needs {size:,} bytes but {directory} has {free:,} free; lower it or free space"
            )
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it: sized, not reserved
                raise SettingError(
                    "offload_disk_gib", f"cannot reserve {size:,} bytes in {directory}: {e.strerror}; lower it"
                ) from None
            os.ftruncate(fd, size)
    except SettingError:
        os.close(fd)
        os.unlink(path)
        raise
    _FILES[fd] = path
    return fd


_FILES: dict[int, str] = {}  # open disk-tier descriptors -> their paths


def _close(fd: int) -> None:
    path = _FILES.pop(fd, None)
    os.close(fd)
    if path is not None and os.path.exists(path):
        os.unlink(path)
