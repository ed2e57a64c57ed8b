"""A GGUF file's header: its metadata key-values and tensor names, read without touching the tensors.

gguf-py's ``GGUFReader`` builds a numpy view per array element, so the 49,152 tokens and 48,900
merges of SmolLM2's tokenizer take it about 6 s on a 2-core machine; this reads the same header
in a fraction of a second with ``struct``. Layout (ggml's docs/gguf.md, little-endian, version 2
and 3)::

    magic "GGUF" | version u32 | tensor count u64 | metadata count u64
    metadata: key (u64 length + UTF-8) | value type u32 | value     (arrays: item type u32 | count u64 | items)
    tensor infos: name | n_dims u32 | dims u64 x n_dims | ggml type u32 | data offset u64
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    """``metadata``: key -> value (ints, floats, bools, strings; arrays as lists);
    ``tensor_names`` in file order."""

    version: int
    metadata: dict[str, Any]
    tensor_names: tuple[str, ...]


_U64 = struct.Struct("<Q")


class _Cursor:
    def __init__(self, data: bytes | mmap.mmap, texts: bool = True):
        self.data, self.pos, self.texts = data, 0, texts

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize("<" + fmt)
        return value

    def strings(self, count: int) -> list[str]:
        """``count`` strings in a row (a tokenizer's vocabulary and merges: about 100,000 in
        SmolLM2's file, so one tight loop)."""
        data, pos, end_of_file = self.data, self.pos, len(self.data)
        unpack_size = _U64.unpack_from
        texts = []
        for _ in range(count):
            (size,), pos = unpack_size(data, pos), pos + 8
            if size > end_of_file - pos:
                raise ValueError(f"a string of {size} bytes runs past the end of the file at byte {pos}")
            texts.append(data[pos : pos + size].decode("utf-8", errors="replace"))
            pos += size
        self.pos = pos
        return texts

    def skip_strings(self, count: int) -> list[None]:
        """Past ``count`` strings in a row, without decoding them: ``count`` Nones."""
        data, pos, end_of_file = self.data, self.pos, len(self.data)
        unpack_size = _U64.unpack_from
        for _ in range(count):
            pos += 8 + unpack_size(data, pos)[0]
            if pos > end_of_file:
                raise ValueError(f"a string runs past the end of the file at byte {pos}")
        self.pos = pos
        return [None] * count

    def string(self) -> str:
        return self.strings(1)[0]

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item == _STRING:
                return self.strings(count) if self.texts else self.skip_strings(count)
            if item not in _SCALARS:
                return [self.value(item) for _ in range(count)]
            fmt = f"<{count}{_SCALARS[item]}"
            values = list(struct.unpack_from(fmt, self.data, self.pos))
            self.pos += struct.calcsize(fmt)
            return values
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind} at byte {self.pos}")
        return self.take(_SCALARS[kind])


def read_gguf_header(path: str | Path, texts: bool = True) -> GGUFHeader:
    """The metadata and tensor names of the GGUF file at ``path``; ``texts`` False: each array of
    strings (a tokenizer's vocabulary and merges) as that many Nones, not decoded (a third of the
    time on SmolLM2's file).

    Raises:
        KvplanError: the file cannot be read, is not GGUF (magic), is of an unsupported version
            (1 or above 3), or is cut short inside its header.
    """
    path = Path(path)
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(data, texts)
    except OSError as err:
        raise KvplanError("", f"cannot read the GGUF file ({err.strerror or err})", source=str(path)) from None
    except (ValueError, struct.error) as err:
        raise KvplanError("", f"not a readable GGUF file ({err})", source=str(path)) from None


def _parse(data: mmap.mmap, texts: bool = True) -> GGUFHeader:
    cursor = _Cursor(data, texts)
    if bytes(data[:4]) != b"GGUF":
        raise ValueError("no GGUF magic")
    cursor.pos = 4
    version = cursor.take("I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
    num_tensors, num_metadata = cursor.take("Q"), cursor.take("Q")
    metadata = {}
    for _ in range(num_metadata):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.take("I"))
    names = []
    for _ in range(num_tensors):
        names.append(cursor.string())
        num_dims = cursor.take("I")
        cursor.pos += 8 * num_dims + 4 + 8  # dims, ggml type, data offset
    return GGUFHeader(version, metadata, tuple(names))
