"""``kvplan schema``: the JSON Schema of the workload YAML or of results.json."""

from __future__ import annotations

from typing import Annotated

import typer


def schema(
    which: Annotated[
        str, typer.Argument(help="workload (the workload YAML) or results (a run folder's results.json).")
    ],
) -> None:
    """Print the JSON Schema (draft 2020-12) of the workload YAML or of results.json, for editors and CI validators."""
    import json

    from kvplan.schemas import json_schema

    print(json.dumps(json_schema(which), indent=2))
