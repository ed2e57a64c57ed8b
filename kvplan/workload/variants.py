"""Engine variants (``variants:``): every level runs once per variant, with the same requests.

A variant changes some of the workload's ``engine:`` settings (``{max_num_batched_tokens: 256}``);
each level then runs once per variant in a row, as a shared_prefix workload's cached and
uncached variants do, so the report can set them side by side on identical requests (what
chunked prefill does to the short class's tail in a mix, for instance). A bucket's own
``variants`` replace the workload's. The level key's variant is the variant's name
(kvplan.results.stats.variants).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from kvplan.errors import KvplanError, describe_error
from kvplan.results.stats.prefix_metrics import VARIANTS as PREFIX_VARIANTS
from kvplan.workload.buckets import Variant
from kvplan.workload.schema import EngineSettings, Workload

_FIXED = ("model",)  # a variant runs the same token ids, so the tokenizer (the model) stays


def variants_of(workload: Workload, bucket_index: int) -> list[Variant]:
    """The variants bucket ``bucket_index`` runs on ([]: the workload's engine, once)."""
    own = workload.buckets[bucket_index].variants
    return list(own if own is not None else workload.variants)


def all_variants(workload: Workload) -> dict[str, Variant]:
    """Every variant any bucket runs on, by name, in the order they first appear."""
    found: dict[str, Variant] = {}
    for i in range(len(workload.buckets)):
        for v in variants_of(workload, i):
            found.setdefault(v.name, v)
    return found


def variant_engine(workload: Workload, variant: Variant) -> EngineSettings:
    """The workload's engine settings with ``variant.engine`` put over them, validated.

    Raises:
        ValueError: a setting the engine section refuses (its message names the field).
    """
    merged: dict[str, Any] = {**workload.engine.model_dump(), **variant.engine}
    if "kv_cache_memory" in variant.engine and "num_blocks" not in variant.engine:
        merged["num_blocks"] = None  # one pool size replaces the other
    if "num_blocks" in variant.engine and "kv_cache_memory" not in variant.engine:
        merged["kv_cache_memory"] = None
    return EngineSettings.model_validate(merged)


def variant_workload(workload: Workload, name: str) -> Workload:
    """``workload`` with the engine of its variant ``name`` ("" or an unknown name: as it is)."""
    variant = all_variants(workload).get(name)
    if variant is None or not variant.engine:
        return workload
    updated = workload.model_copy(update={"engine": variant_engine(workload, variant)})
    updated._source, updated._sha256, updated._warnings = workload.source, workload.sha256, workload.warnings
    return updated


def check_variants(workload: Workload) -> None:
    """Unique names, no reserved name, engine keys the engine section has and values it takes,
    and no variants beside shared_prefix (which runs its own two). Raises KvplanError naming the
    YAML path."""
    places = [("variants", workload.variants)] + [
        (f"buckets[{i}].variants", b.variants) for i, b in enumerate(workload.buckets) if b.variants is not None
    ]
    for at, variants in places:
        names = [v.name for v in variants]
        for j, v in enumerate(variants):
            here = f"{at}[{j}]"
            if v.name in PREFIX_VARIANTS:
                raise _error(workload, f"{here}.name", f"{v.name!r} is reserved for shared_prefix runs", "rename it")
            if v.name in names[:j]:
                raise _error(workload, f"{here}.name", f"duplicate variant name {v.name!r}")
            for key in v.engine:
                if key in _FIXED:
                    raise _error(
                        workload,
                        f"{here}.engine.{key}",
                        "a variant runs the same token ids, so it cannot change the model",
                        "load-test the other model in a workload of its own",
                    )
                if key not in EngineSettings.model_fields:
                    raise _error(
                        workload,
                        f"{here}.engine.{key}",
                        "unknown engine setting",
                        f"give one of {', '.join(k for k in EngineSettings.model_fields if k not in _FIXED)}",
                    )
            try:
                variant_engine(workload, v)
            except ValidationError as err:
                field, problem = describe_error(err)
                raise _error(workload, f"{here}.engine.{field}" if field else f"{here}.engine", problem) from None
        if variants and workload.shared_prefix is not None:
            raise _error(
                workload,
                at,
                "not supported with shared_prefix, which runs every level as its own cached and uncached variants",
                "drop variants, or run them as workloads without shared_prefix",
            )


def check_target_variants(workload: Workload) -> None:
    """A ``--target`` run cannot change the server's engine: refuse a variant that changes any
    setting. Raises KvplanError naming the first such setting."""
    for i in range(len(workload.buckets)):
        for j, v in enumerate(variants_of(workload, i)):
            if v.engine:
                own = workload.buckets[i].variants is not None
                at = f"buckets[{i}].variants[{j}]" if own else f"variants[{j}]"
                key = next(iter(v.engine))
                raise _error(
                    workload,
                    f"{at}.engine.{key}",
                    "a --target run cannot change the server's engine",
                    "drop the variant's engine settings, or load-test the bundled engine",
                )


def _error(workload: Workload, field: str, problem: str, fix: str | None = None) -> KvplanError:
    return KvplanError(field, problem, fix, source=workload.source)
