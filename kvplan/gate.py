"""``kvplan gate``: one saved run against a baseline file, check by check -> GateResult -> exit code.

::

    RUN_DIR/results.json --read_values--> current values --+
    baseline YAML --load_baseline--> baseline values ------+--compare--> GateResult (exit 0 | 1)
    tolerance per metric: catalog default < baseline file < the run's workload ``gate:`` section

The gate reads only results.json (the summaries every view reads). A baseline belongs to one
workload: the run's name and traffic (seed, dataset, slo, buckets, shared prefix: every section
but ``NOT_IDENTITY``) must match the baseline's, compared after both configs pass through the
current Workload schema, so a field added later with a default does not orphan old baselines.
The engine section may differ: a changed pool, block size, model or engine is what the gate
exists to judge; the differences are listed as notes. Bad input (no run, no baseline, another
workload, an unknown metric, an unfinished run) is a KvplanError (exit 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from kvplan.errors import KvplanError
from kvplan.yaml_input import read_yaml
from kvplan.gate_metrics import (
    METRICS, METRICS_BY_NAME, RUN_SCOPE, CheckKey, Tolerance, check_metric_names, read_values,
)
from kvplan.results import load_run, write_atomic

BASELINE_SCHEMA = 1
# Workload sections that are not the traffic: what the gate judges (engine), views (plan), the
# gate's own tolerances and the fp8 quality check. Every other section, present or future, is
# part of the workload's identity.
NOT_IDENTITY = ("engine", "plan", "gate", "fp8_quality")
_RECORD = "record one with: kvplan gate RUN_DIR --baseline FILE --update-baseline"
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


@dataclass(frozen=True)
class Check:
    """One metric at one scope: both values, the tolerance in force (``worse`` set), the worst
    value that passes (``limit``, +-inf when the baseline has none) and the verdict."""

    key: CheckKey
    baseline: float | None
    current: float | None
    tolerance: Tolerance
    limit: float
    passed: bool
    missing: bool = False  # the run has no such check (a level it did not run)


@dataclass(frozen=True)
class GateResult:
    run_dir: Path
    baseline: Baseline
    checks: tuple[Check, ...]
    notes: tuple[str, ...]

    @property
    def regressions(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def exit_code(self) -> int:
        """0 when every check holds, 1 on any regression."""
        return 1 if self.regressions else 0


# ---- reading --------------------------------------------------------------------------------
def load_finished_run(run_dir: Path) -> dict[str, Any]:
    """results.json of a run that completed. Raises KvplanError: no run there, or unfinished."""
    results = load_run(run_dir).results
    status = results.get("status")
    if status != "complete":
        raise KvplanError(f"{Path(run_dir) / 'results.json'}: status", f"the run is {status!r}, not 'complete'",
                          "gate a run that finished")
    return results


def _describe(err: ValidationError) -> tuple[str, str]:
    from kvplan.yaml_input import describe_error

    return describe_error(err)


def load_baseline(path: Path) -> Baseline:
    """Read and validate a baseline YAML.

    Raises:
        KvplanError: a missing or unreadable file, a file that is not a baseline, an unknown
            metric, or a metric under the wrong kind of scope (one line naming the field).
    """
    path = Path(path)
    if not path.is_file():
        raise KvplanError(str(path), "no such baseline file", _RECORD)
    try:
        raw_bytes = path.read_bytes()
    except OSError as err:
        raise KvplanError(str(path), f"cannot read baseline ({str(err).splitlines()[0]})") from None
    data = read_yaml(raw_bytes, str(path))  # malformed YAML or a duplicate key: one line
    if not isinstance(data, dict) or "kvplan_gate_baseline" not in data:
        raise KvplanError(str(path), "not a kvplan gate baseline (no kvplan_gate_baseline key)", _RECORD)
    try:
        raw = _BaselineFile.model_validate(data)
    except ValidationError as err:
        where, problem = _describe(err)
        raise KvplanError(f"{path}: {where}", problem) from None
    values: dict[CheckKey, float | None] = {}
    for scope, metrics in raw.values.items():
        bucket, _, level = ("", "", "") if scope == RUN_SCOPE else scope.partition(" ")
        kind = "level" if level else "bucket" if bucket else "run"
        for name, value in metrics.items():
            metric = METRICS_BY_NAME.get(name)
            if metric is None:
                raise KvplanError(f"{path}: values.{scope}.{name}",
                                  f"unknown metric; use one of {', '.join(METRICS_BY_NAME)}")
            if metric.scope != kind:
                raise KvplanError(f"{path}: values.{scope}.{name}", f"is a {metric.scope} metric, not a {kind} one")
            values[CheckKey(name, bucket, level)] = value
    return Baseline(path, raw.workload.name, raw.workload.config, raw.recorded, raw.tolerances, values)


def _normalized(config: dict[str, Any], where: str, fix: str) -> dict[str, Any]:
    """A workload config dict through today's schema (defaults filled in), as JSON types."""
    from kvplan.workload import Workload

    try:
        return Workload.model_validate(config).model_dump(mode="json")
    except ValidationError as err:
        field, problem = _describe(err)
        raise KvplanError(where, f"its workload does not validate today ({field}: {problem})", fix) from None


def check_same_workload(baseline: Baseline, results: dict[str, Any], run_dir: Path) -> list[str]:
    """Raise unless the run is of the baseline's workload; return notes on engine differences.

    Raises:
        KvplanError: another workload name, or the same name with other traffic sections.
    """
    ours = _normalized(results.get("workload", {}).get("config") or {}, f"{run_dir}/results.json: workload.config",
                       "rerun kvplan loadtest")
    theirs = _normalized(baseline.workload_config, f"{baseline.path}: workload.config",
                         "record the baseline again with --update-baseline")
    fix = "pass this workload's baseline, or record one with --update-baseline"
    if ours["name"] != theirs["name"]:
        raise KvplanError(f"{baseline.path}: workload",
                          f"recorded for workload {theirs['name']!r}, the run is of {ours['name']!r}", fix)
    sections = [s for s in dict.fromkeys([*ours, *theirs]) if s not in NOT_IDENTITY]
    changed = [s for s in sections if ours.get(s) != theirs.get(s)]
    if changed:
        raise KvplanError(f"{baseline.path}: workload",
                          f"recorded for another version of workload {ours['name']!r} ({', '.join(changed)} differ)", fix)
    a, b = theirs.get("engine") or {}, ours.get("engine") or {}
    moved = [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
    return [f"engine settings differ from the baseline: {', '.join(moved)}"] if moved else []


def _current_values(results: dict[str, Any], run_dir: Path) -> dict[CheckKey, float | None]:
    try:
        return read_values(results)
    except ValueError as err:
        raise KvplanError(f"{run_dir}/results.json: levels", str(err)) from None


# ---- comparing ------------------------------------------------------------------------------
def compare(baseline: Baseline, current: dict[CheckKey, float | None],
            overrides: dict[str, Tolerance]) -> tuple[Check, ...]:
    """Every baseline value against the run's, in the baseline's order. The tolerance of a
    metric is ``overrides`` (the workload's gate: section), else the baseline file's, else the
    catalog default."""
    checks = []
    for key, base in baseline.values.items():
        metric = METRICS_BY_NAME[key.metric]
        tol = metric.tolerance(overrides.get(key.metric) or baseline.tolerances.get(key.metric))
        limit = tol.limit(metric.rank(base, tol.worse))
        if metric.held_if_clean and _baseline_preempted(baseline, key):
            limit = math.inf if tol.worse == "higher" else -math.inf
        cur = current.get(key)
        missing = key not in current
        passed = not missing and tol.holds(metric.rank(cur, tol.worse), limit)
        checks.append(Check(key, base, cur, tol, limit, passed, missing))
    return tuple(checks)


def _baseline_preempted(baseline: Baseline, key: CheckKey) -> bool:
    """Whether the baseline's level of ``key`` preempted (its KV use was bound by the pool)."""
    return bool(baseline.values.get(CheckKey("num_preemptions", key.bucket, key.level)))


def _workload_tolerances(results: dict[str, Any], run_dir: Path) -> dict[str, Tolerance]:
    """The run's workload ``gate:`` tolerances. Raises KvplanError naming a bad entry."""
    section = ((results.get("workload") or {}).get("config") or {}).get("gate") or {}
    try:
        tolerances = {name: Tolerance.model_validate(t) for name, t in (section.get("tolerances") or {}).items()}
        check_metric_names(tolerances)
    except (ValidationError, ValueError) as err:
        problem = _describe(err)[1] if isinstance(err, ValidationError) else str(err)
        raise KvplanError(f"{run_dir}/results.json: workload.config.gate", problem) from None
    return tolerances


def run_gate(run_dir: Path, baseline_path: Path) -> GateResult:
    """Compare a finished run with a baseline. Raises KvplanError on bad input (see module)."""
    run_dir = Path(run_dir)
    results = load_finished_run(run_dir)
    baseline = load_baseline(baseline_path)
    if not baseline.values:
        raise KvplanError(f"{baseline_path}: values", "empty: a baseline that checks nothing cannot pass a run", _RECORD)
    notes = check_same_workload(baseline, results, run_dir)  # a list: more notes follow
    overrides = _workload_tolerances(results, run_dir)
    current = _current_values(results, run_dir)
    new = [k for k in current if k not in baseline.values]
    if new:
        notes.append(f"{len(new)} checks of this run are not in the baseline (e.g. {new[0].metric} at "
                     f"{new[0].scope_label}); re-record it to gate them")
    if overrides:
        notes.append(f"tolerances from the workload's gate: section (they win over the baseline file's): "
                     f"{', '.join(overrides)}")
    checks = compare(baseline, current, overrides)
    unheld = [c for c in checks if math.isinf(c.limit) and METRICS_BY_NAME[c.key.metric].held_if_clean]
    if unheld:
        notes.append(f"{unheld[0].key.metric} not held at {len(unheld)} level(s) where the baseline preempted "
                     f"(e.g. {unheld[0].key.scope_label}): the peak there was the pool's size, not the demand")
    return GateResult(run_dir, baseline, checks, tuple(notes))


# ---- writing --------------------------------------------------------------------------------
def _rounded(value: float | None) -> float | int | None:
    if isinstance(value, float):
        return float(f"{value:.6g}")  # timings to 6 significant digits keep the file diffable
    return value


def write_baseline(run_dir: Path, path: Path) -> tuple[Path, int]:
    """Write a finished run's values as the baseline at ``path``; returns (path, values written).

    Every metric's tolerance in force is written out in full, so it can be edited there: the
    run's workload ``gate:`` section where it sets one (that section keeps winning), else an
    existing baseline's, else the catalog default.

    Raises:
        KvplanError: the run is not finished, or ``path`` holds something that is not a
            baseline, or the baseline of another workload (never overwritten; a changed version
            of the same workload is re-recorded).
    """
    run_dir, path = Path(run_dir), Path(path)
    results = load_finished_run(run_dir)
    kept: dict[str, Tolerance] = {}
    if path.exists():
        try:
            old = load_baseline(path)
        except KvplanError as err:
            raise KvplanError(str(path), f"will not overwrite it: {err.problem}", "choose another --baseline path") from None
        ours = (results.get("workload") or {}).get("name")
        if old.workload_name != ours:
            raise KvplanError(f"{path}: workload", f"will not overwrite the baseline of workload {old.workload_name!r}"
                              f" with a run of {ours!r}", "choose another --baseline path (or delete that file)")
        kept = old.tolerances
    overrides = _workload_tolerances(results, run_dir)
    tolerances = {}
    for m in METRICS:
        tol = m.tolerance(overrides.get(m.name) or kept.get(m.name))
        tolerances[m.name] = {"worse": tol.worse, "abs": tol.abs, "rel": tol.rel}
    values: dict[str, dict[str, Any]] = {}
    for key, value in _current_values(results, run_dir).items():
        values.setdefault(key.scope_label, {})[key.metric] = _rounded(value)
    workload, run = results["workload"], results.get("run") or {}
    recorded = {"run_dir": str(run_dir), "started_at": results.get("started_at"),
                **{k: run.get(k) for k in ("kvplan_version", "platform", "python", "torch", "model", "device", "dtype")}}
    doc = {
        "kvplan_gate_baseline": BASELINE_SCHEMA,
        "workload": {"name": workload["name"], "sha256": workload.get("sha256", ""), "config": workload["config"]},
        "recorded": recorded,
        "tolerances": tolerances,
        "values": values,
    }
    header = _HEADER + (f"# from the workload's gate: section (edit them there): {', '.join(overrides)}\n"
                        if overrides else "")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise KvplanError(f"--baseline {path}", f"cannot make its folder ({err.strerror or err})",
                          "choose another --baseline path") from None
    write_atomic(path, header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110))
    return path, sum(len(v) for v in values.values())
