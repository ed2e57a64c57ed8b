"""The variant part of a level's key (kvplan.results.records.LevelKey.variant), read and written in
one place::

    ""                    the level as the workload gives it
    cached / uncached     a shared_prefix run's two variants (kvplan.results.stats.prefix_metrics)
    chunk-256             an engine variant (kvplan.workload.variants)
    alone:chat            a mix class run alone at its share of the level's load (interference)
    chunk-256 alone:chat  the same, on an engine variant

Names (workload, class, variant) hold only ``[A-Za-z0-9_.-]``, so the space and the colon never
occur inside one.
"""

from __future__ import annotations

ALONE = "alone:"


def alone_variant(variant: str, request_class: str) -> str:
    """The variant of class ``request_class`` run alone, on engine variant ``variant`` ("" = none)."""
    return f"{variant} {ALONE}{request_class}" if variant else f"{ALONE}{request_class}"


def split_variant(variant: str) -> tuple[str, str | None]:
    """(the engine variant or "", the class run alone or None) of a level's variant."""
    base, sep, alone = variant.rpartition(ALONE)
    if not sep or not alone or not (base == "" or base.endswith(" ")):
        return variant, None
    return base.rstrip(), alone


def mixed_variant(variant: str) -> str:
    """The variant of the mixed level a class-alone level belongs to (``variant`` itself otherwise)."""
    return split_variant(variant)[0]


def is_alone(variant: str) -> bool:
    """Whether the level ran one mix class alone (an interference level)."""
    return split_variant(variant)[1] is not None
