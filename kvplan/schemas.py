"""JSON Schema (draft 2020-12) of kvplan's files, for editors and CI validators.

``workload``: the workload YAML (kvplan.load.workload.Workload, shorthands included);
``results``: a run folder's results.json (kvplan.results.run_result.RunResult, as written).
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import KvplanError

DIALECT = "https://json-schema.org/draft/2020-12/schema"
KINDS = ("workload", "results")


def json_schema(which: str) -> dict[str, Any]:
    """The JSON Schema of ``which`` (one of KINDS).

    Raises:
        KvplanError: any other name (field ``which``).
    """
    if which == "workload":
        from kvplan.load.workload import Workload

        schema = Workload.model_json_schema(mode="validation")
        title = "kvplan workload (YAML)"
    elif which == "results":
        from kvplan.results.run_result import RunResult

        schema = RunResult.model_json_schema(mode="serialization")
        title = "kvplan run result (results.json)"
    else:
        raise KvplanError("which", f"unknown schema {which!r}", f"use one of {', '.join(KINDS)}")
    return {"$schema": DIALECT, **schema, "title": title}
