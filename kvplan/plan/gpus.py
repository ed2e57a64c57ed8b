"""The GPU table: each bundled GPU's memory as its driver reports it, with the source.

``data/gpus.yaml`` holds the numbers and where each was read; see its header for what
"as the driver reports it" means.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from kvplan.errors import KvplanError

GPUS_FILE = Path(__file__).parent / "data" / "gpus.yaml"


@lru_cache(maxsize=1)
def gpu_table() -> dict[str, dict]:
    """GPU name (upper case) -> entry of kvplan/data/gpus.yaml (``memory_gib``, ``source``, ...)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    entries = yaml.load(GPUS_FILE.read_text(), Loader=loader)["gpus"]
    return {name.upper(): entry for name, entry in entries.items()}


def lookup_gpu(name: str) -> tuple[str, float]:
    """(table name, memory in GiB as its driver reports it) of a bundled GPU. Names match case-insensitively,
    spaces as dashes, and by a unique prefix (``h100`` -> ``H100-80GB``).

    Raises:
        KvplanError: an unknown or ambiguous GPU name (the candidates are listed).
    """
    key = name.upper().replace(" ", "-").replace("_", "-")
    table = gpu_table()
    matches = [key] if key in table else [known for known in table if known.startswith(key)]
    if len(matches) != 1:
        problem = f"ambiguous GPU {name!r}" if matches else f"unknown GPU {name!r}"
        raise KvplanError("gpu", problem, f"use one of {', '.join(matches or sorted(table))}, or `gpu_memory_gib`")
    return matches[0], float(table[matches[0]]["memory_gib"])
