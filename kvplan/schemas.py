"""JSON Schema (draft 2020-12) of kvplan's files, for editors and CI validators.

``workload``: the workload YAML (kvplan.workload.schema.Workload, shorthands included);
``results``: a run folder's results.json (kvplan.results.run_result.RunResult, as written);
``plan``: a plan's plan.json and ``kvplan plan --json`` (kvplan.results.plan_result.PlanRun).
"""

from __future__ import annotations

import json
from typing import Any

from kvplan.errors import KvplanError

DIALECT = "https://json-schema.org/draft/2020-12/schema"
KINDS = ("workload", "results", "plan")
# class -> the $defs name the published schemas have always used (classes renamed since keep it)
PUBLISHED_NAMES = {
    "Deployment": "PlanTarget",
    "DeploymentEstimate": "PlanEstimate",
    "DeploymentBucket": "PlanBucket",
    "LevelSchedule": "LevelPlan",
}


def _published(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every renamed class under its published $defs name and title, $defs sorted."""
    defs = schema.get("$defs", {})
    for new, old in PUBLISHED_NAMES.items():
        if new in defs:
            part = defs.pop(new)
            if part.get("title") == new:
                part["title"] = old
            defs[old] = part
    text = json.dumps(schema)
    for new, old in PUBLISHED_NAMES.items():
        text = text.replace(f'"#/$defs/{new}"', f'"#/$defs/{old}"')
    out = json.loads(text)
    if "$defs" in out:
        out["$defs"] = dict(sorted(out["$defs"].items()))
    return out


def json_schema(which: str) -> dict[str, Any]:
    """The JSON Schema of ``which`` (one of KINDS).

    Raises:
        KvplanError: any other name (field ``which``).
    """
    if which == "workload":
        from kvplan.workload.schema import Workload

        schema = Workload.model_json_schema(mode="validation")
        title = "kvplan workload (YAML)"
    elif which == "results":
        from kvplan.results.run_result import RunResult

        schema = RunResult.model_json_schema(mode="serialization")
        title = "kvplan run result (results.json)"
    elif which == "plan":
        from kvplan.results.plan_result import PlanRun

        schema = PlanRun.model_json_schema(mode="serialization")
        title = "kvplan plan (plan.json)"
    else:
        raise KvplanError("which", f"unknown schema {which!r}", f"use one of {', '.join(KINDS)}")
    return {"$schema": DIALECT, **_published(schema), "title": title}
