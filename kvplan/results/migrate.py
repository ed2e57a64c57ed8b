"""Older results.json files read as today's run result.

Schema 1 (kvplan 0.1.0, every run folder and baseline before the typed run result): one ``run``
section held both the machine and the engine's facts; the KV dtype was ``kv_dtype`` in the
estimate and its plan targets; the SLO lived only in the workload config. ``migrate`` rewrites
such a dict into schema 2's shape; the result is then validated as a ``RunResult``.
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import KvplanError

# schema 1's ``run`` keys that describe the machine and versions; the rest were the engine's
_RUN_KEYS = ("kvplan_version", "python", "platform", "torch", "transformers", "dataset")
# schema 1's derived engine keys, computed properties in schema 2
_DERIVED = ("bytes_per_token", "pool_bytes", "pool_tokens")


def migrate(data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` (a results.json object) in the current schema's shape.

    Raises:
        KvplanError: a schema_version this kvplan does not know (naming ``where``).
    """
    version = data.get("schema_version")
    if version == 2:
        return data
    if version != 1:
        raise KvplanError(
            "schema_version",
            f"expected 1 or 2 (got {version!r})",
            "read it with the kvplan version that wrote it",
            source=where,
        )
    return _from_v1(data)


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    old_run = dict(data.get("run") or {})
    run = {k: old_run.pop(k) for k in _RUN_KEYS if k in old_run}
    engine = {k: v for k, v in old_run.items() if k not in _DERIVED}
    out = {k: v for k, v in data.items() if k not in ("run", "schema_version")}
    out.update(schema_version=2, source="measured", run=run, engine=engine or None)
    estimate = data.get("estimate")
    if estimate:
        estimate = {("kv_cache_dtype" if k == "kv_dtype" else k): v for k, v in estimate.items()}
        estimate["plan"] = [
            {("kv_cache_dtype" if k == "kv_dtype" else k): v for k, v in target.items()}
            for target in estimate.get("plan") or []
        ]
        out["estimate"] = estimate
    out["slo"] = ((data.get("workload") or {}).get("config") or {}).get("slo") or {}
    if "kv" not in data:  # killed before its summaries: none, as in schema 2
        out.pop("levels", None), out.pop("buckets", None)
    return out
