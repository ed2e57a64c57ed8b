"""KV offload tiers of the bundled engine (issue 37; the policy: docs/architecture.md#kv-offload-tiers).

Below the device's block pool, a host tier (CPU memory) and a disk tier (one file per pool), each
an LRU of block hashes with a capacity in blocks::

    device pool --(a cached block evicted for reuse: store)--> host --(host LRU evicted)--> disk
    admission: prefix lookup device, else host, else disk --(hit below: load into a fresh block)--> device

tiers: the policy and its bookkeeping, tensor-free (``Offload``; a simulation can run it without a
model). storage: the bytes, for real (``KVMover``: the KV cache's blocks to a host tensor and a
disk file and back) and the start-up checks of a config (``build_offload``).
"""
