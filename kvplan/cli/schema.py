"""``kvplan schema``: the JSON Schema of the workload YAML, of results.json or of plan.json."""

from __future__ import annotations

from typing import Annotated

import typer


def schema(
    which: Annotated[
        str,
        typer.Argument(
            help="workload (the workload YAML), results (a run folder's results.json) or plan (a plan's plan.json)."
        ),
    ],
) -> None:
    """Print the JSON Schema (draft 2020-12) of the workload YAML, results.json or plan.json, for editors and CI validators."""  # noqa: E501
    import json

    from kvplan.schemas import json_schema

    print(json.dumps(json_schema(which), indent=2))
