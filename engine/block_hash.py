"""The prefix cache's chained block hash (engine.block_manager): a full block's hash chains over
its parent's, so two blocks hash alike only where every block before them does too (after
vLLM's automatic prefix caching, docs.vllm.ai "Automatic Prefix Caching")."""

from __future__ import annotations

import hashlib
from array import array

_NO_PARENT = b"\0" * 16  # the first block's parent hash


def hash_block(parent: bytes | None, token_ids: list[int] | tuple[int, ...], extra: str | None) -> bytes:
    """16-byte chained hash of one full block (blake2b over parent hash, int64 token ids, extra key)."""
    return _hash_bytes(parent, array("q", token_ids).tobytes(), extra)


def _hash_bytes(parent: bytes | None, token_bytes: bytes, extra: str | None) -> bytes:
    """``hash_block`` of a block whose token ids are already int64 bytes."""
    data = (parent or _NO_PARENT) + token_bytes
    if extra is not None:
        data += b"\x01salt:" + extra.encode()
    return hashlib.blake2b(data, digest_size=16).digest()
