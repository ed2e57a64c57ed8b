"""Gate baselines: the values of one finished run, the tolerances in force, and the workload they
belong to, as a YAML file that CI keeps next to the code.

``write_baseline`` records one (every metric's tolerance written out, so it can be edited
there); ``load_baseline`` reads one back, refusing anything that is not a baseline, an unknown
metric, or a metric under the wrong kind of scope. The file format has its own version
(``kvplan_gate_baseline: 1``), independent of results.json's schema.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from kvplan.errors import KvplanError, validation_error
from kvplan.gate.values import RUN_SCOPE, CheckKey, read_values
from kvplan.results.gated import METRICS, METRICS_BY_NAME, Tolerance, check_metric_names
from kvplan.results.run_result import RunResult
from kvplan.results.store import write_atomic
from kvplan.yaml_input import dump_yaml, read_input_file, read_yaml

BASELINE_SCHEMA = 1
RECORD = "record one with: kvplan gate RUN_DIR --baseline FILE --update-baseline"
_HEADER = """\
# kvplan gate baseline, written by: kvplan gate RUN_DIR --baseline FILE --update-baseline
# tolerances: edit freely; a regression is a move the `worse` way beyond abs + rel x |baseline|
# (a workload's gate: section overrides these). values: re-record with --update-baseline.
"""


class _WorkloadRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    sha256: str = ""
    config: dict[str, Any]


class _BaselineFile(BaseModel):
    """The baseline YAML as written by ``write_baseline``; ``values``: scope -> metric -> value."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    kvplan_gate_baseline: Literal[1]
    workload: _WorkloadRef
    recorded: dict[str, Any] = {}
    tolerances: dict[str, Tolerance] = {}
    values: dict[str, dict[str, float | None]]

    @field_validator("tolerances")
    @classmethod
    def _known(cls, value: dict[str, Tolerance]) -> dict[str, Tolerance]:
        check_metric_names(value)
        return value


@dataclass(frozen=True)
class Baseline:
    """A baseline file read back: the workload it was recorded for, its tolerances per metric
    and its values per check (units as in METRICS)."""

    path: Path
    workload_name: str
    workload_config: dict[str, Any]
    recorded: dict[str, Any]
    tolerances: dict[str, Tolerance]
    values: dict[CheckKey, float | None]


def load_baseline(path: Path) -> Baseline:
    """Read and validate a baseline YAML.

    Raises:
        KvplanError: a missing or unreadable file, a file that is not a baseline, an unknown
            metric, a metric under the wrong kind of scope, or a value of NaN (one line naming the
            field).
    """
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise KvplanError("", "no such baseline file", RECORD, source=where)
    raw_bytes = read_input_file(path, where, "baseline")  # at most 64 MiB: a wrong path is not read whole
    data = read_yaml(raw_bytes, where)  # malformed YAML or a duplicate key: one line
    if not isinstance(data, dict) or "kvplan_gate_baseline" not in data:
        raise KvplanError("", "not a kvplan gate baseline (no kvplan_gate_baseline key)", RECORD, source=where)
    try:
        raw = _BaselineFile.model_validate(data)
    except ValidationError as err:
        raise validation_error(err, where) from None
    values: dict[CheckKey, float | None] = {}
    for scope, metrics in raw.values.items():
        bucket, _, level = ("", "", "") if scope == RUN_SCOPE else scope.partition(" ")
        kind = "level" if level else "bucket" if bucket else "run"
        for name, value in metrics.items():
            metric = METRICS_BY_NAME.get(name)
            if metric is None:
                raise KvplanError(
                    f"values.{scope}.{name}", f"unknown metric; use one of {', '.join(METRICS_BY_NAME)}", source=where
                )
            if metric.scope != kind:
                raise KvplanError(
                    f"values.{scope}.{name}", f"is a {metric.scope} metric, not a {kind} one", source=where
                )
            if value is not None and math.isnan(value):  # compares false with anything: a silent regression
                raise KvplanError(
                    f"values.{scope}.{name}",
                    "is NaN, which no run can be compared with",
                    "give a number (null where the baseline run had none), or re-record the baseline with"
                    " kvplan gate RUN_DIR --baseline FILE --update-baseline",
                    source=where,
                )
            values[CheckKey(name, bucket, level)] = value
    return Baseline(path, raw.workload.name, raw.workload.config, raw.recorded, raw.tolerances, values)


# ---- writing --------------------------------------------------------------------------------
def _rounded(value: float | None) -> float | int | None:
    if isinstance(value, float):
        return float(f"{value:.6g}")  # timings to 6 significant digits keep the file diffable
    return value


def write_baseline(result: RunResult, run_dir: Path, path: Path, overrides: dict[str, Tolerance]) -> tuple[Path, int]:
    """Write a finished run's values as the baseline at ``path``; returns (path, values written).

    Every metric's tolerance in force is written out in full, so it can be edited there:
    ``overrides`` (the run's workload ``gate:`` section, which keeps winning) where it sets one,
    else an existing baseline's, else the catalog default.

    Raises:
        KvplanError: ``path`` holds something that is not a baseline, or the baseline of another
            workload (never overwritten; a changed version of the same workload is re-recorded).
    """
    path = Path(path)
    kept: dict[str, Tolerance] = {}
    if path.is_dir():
        raise KvplanError("baseline", f"{path} is a folder", "give the path of a YAML file")
    if path.exists():
        try:
            old = load_baseline(path)
        except KvplanError as err:
            raise KvplanError(
                "baseline", f"will not overwrite {path}: {err.problem}", "choose another `baseline` path"
            ) from None
        if old.workload_name != result.workload.name:
            raise KvplanError(
                "workload",
                f"will not overwrite the baseline of workload {old.workload_name!r}"
                f" with a run of {result.workload.name!r}",
                "choose another `baseline` path (or delete that file)",
                source=str(path),
            )
        kept = old.tolerances
    tolerances = {}
    for m in METRICS:
        tol = m.tolerance(overrides.get(m.name) or kept.get(m.name))
        tolerances[m.name] = {"worse": tol.worse, "abs": tol.abs, "rel": tol.rel}
    values: dict[str, dict[str, Any]] = {}
    for key, value in read_values(result, str(run_dir)).items():
        values.setdefault(key.scope_label, {})[key.metric] = _rounded(value)
    run, engine = result.run, result.engine
    recorded = {
        "run_dir": str(run_dir),
        "started_at": result.started_at,
        "kvplan_version": run.kvplan_version,
        "platform": run.platform,
        "python": run.python,
        "torch": run.torch,
        "model": engine.model if engine else None,
        "device": engine.device if engine else None,
        "dtype": engine.dtype if engine else None,
    }
    workload = result.workload
    doc = {
        "kvplan_gate_baseline": BASELINE_SCHEMA,
        "workload": {"name": workload.name, "sha256": workload.sha256, "config": workload.config},
        "recorded": recorded,
        "tolerances": tolerances,
        "values": values,
    }
    header = _HEADER + (
        f"# from the workload's gate: section (edit them there): {', '.join(overrides)}\n" if overrides else ""
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise KvplanError(
            "baseline", f"cannot make the folder of {path} ({err.strerror or err})", "choose another `baseline` path"
        ) from None
    write_atomic(path, header + dump_yaml(doc, sort_keys=False, default_flow_style=None, width=110))
    return path, sum(len(v) for v in values.values())
