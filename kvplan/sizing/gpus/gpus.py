"""The GPU table: each bundled GPU's memory as its driver reports it, with the source.

``data/gpus.yaml`` holds the numbers and where each was read; see its header for what
"as the driver reports it" means. A GPU is found by its canonical name or one of its listed
aliases, case-insensitively with spaces and underscores read as dashes, and by nothing else: no
prefix matching (``H20`` must never become ``H200``). Other data keyed by GPU (peak FLOP/s,
bandwidth) uses the canonical names.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

from kvplan.errors import KvplanError

GPUS_FILE = Path(__file__).parents[1] / "data" / "gpus.yaml"


@lru_cache(maxsize=1)
def gpu_table() -> dict[str, dict]:
    """Canonical GPU name -> entry of kvplan/sizing/data/gpus.yaml (``memory_gib``, ``reported_by``,
    ``source``, optional ``aliases``)."""
    from kvplan.yaml_input import load_data

    return load_data(GPUS_FILE.read_text())["gpus"]


def _key(name: str) -> str:
    return name.strip().upper().replace(" ", "-").replace("_", "-")


@lru_cache(maxsize=1)
def _names() -> dict[str, str]:
    """Normalized canonical name or alias -> canonical name."""
    index = {}
    for canonical, entry in gpu_table().items():
        for name in (canonical, *entry.get("aliases", [])):
            index[_key(name)] = canonical
    return index


def canonical_gpu(name: str) -> str:
    """The canonical name of ``name`` (a canonical name or a listed alias, any case).

    Raises:
        KvplanError: naming ``gpu``, for any other name, with the closest known names.
    """
    found = _names().get(_key(name))
    if found is None:
        raise KvplanError("gpu", f"unknown GPU {name!r}", f"{gpu_hint(name)}; or give `gpu_memory_gib`")
    return found


def gpu_hint(name: str) -> str:
    """``closest: A, B`` (up to three canonical names: those that start with ``name``, then the
    most similar), or every known name. A suggestion only: a prefix never selects a GPU."""
    key = _key(name)
    starting = [known for known in _names() if known.startswith(key)] if key else []
    similar = difflib.get_close_matches(key, list(_names()), n=6, cutoff=0.4)
    close = list(dict.fromkeys(_names()[c] for c in starting + similar))[:3]
    return f"closest: {', '.join(close)}" if close else f"known: {', '.join(gpu_table())}"


def lookup_gpu(name: str) -> tuple[str, float]:
    """(canonical name, memory in GiB as its driver reports it) of a bundled GPU.

    Raises:
        KvplanError: an unknown name (see :func:`canonical_gpu`).
    """
    canonical = canonical_gpu(name)
    return canonical, float(gpu_table()[canonical]["memory_gib"])
