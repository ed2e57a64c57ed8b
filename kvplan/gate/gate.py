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
from typing import Any

from pydantic import ValidationError

from kvplan.errors import KvplanError, describe_error
from kvplan.gate.baseline import RECORD, Baseline, load_baseline, write_baseline
from kvplan.gate.values import CheckKey, read_values
from kvplan.results.gated import METRICS_BY_NAME, Tolerance
from kvplan.results.run_result import RESULTS_FILE, RunResult, read_result
from kvplan.workload.schema import Workload

# Workload sections that are not the traffic: what the gate judges (engine, or the remote server
# under test: target), views (plan), the gate's own tolerances and the fp8 quality check. Every
# other section, present or future, is part of the workload's identity.
NOT_IDENTITY = ("engine", "target", "plan", "gate", "fp8_quality")


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
def load_finished_run(run_dir: Path) -> RunResult:
    """The result of a run that completed. Raises KvplanError: no run there, or unfinished."""
    result = read_result(run_dir)
    if result.status != "complete":
        raise KvplanError(
            "status",
            f"the run is {result.status!r}, not 'complete'",
            "gate a run that finished",
            source=str(Path(run_dir) / RESULTS_FILE),
        )
    return result


def _normalized(config: dict[str, Any], source: str, fix: str) -> dict[str, Any]:
    """A workload config dict through today's schema (defaults filled in), as JSON types."""
    try:
        return Workload.model_validate(config).model_dump(mode="json")
    except ValidationError as err:
        field, problem = describe_error(err)
        raise KvplanError(
            "workload.config", f"its workload does not validate today ({field}: {problem})", fix, source=source
        ) from None


def check_same_workload(baseline: Baseline, result: RunResult, run_dir: Path) -> list[str]:
    """Raise unless the run is of the baseline's workload; return notes on engine differences.

    Raises:
        KvplanError: another workload name, or the same name with other traffic sections.
    """
    ours = _normalized(result.workload.config, str(run_dir / RESULTS_FILE), "rerun kvplan loadtest")
    theirs = _normalized(
        baseline.workload_config, str(baseline.path), "record the baseline again with --update-baseline"
    )
    fix = "pass this workload's baseline, or record one with --update-baseline"
    if ours["name"] != theirs["name"]:
        raise KvplanError(
            "workload",
            f"recorded for workload {theirs['name']!r}, the run is of {ours['name']!r}",
            fix,
            source=str(baseline.path),
        )
    sections = [s for s in dict.fromkeys([*ours, *theirs]) if s not in NOT_IDENTITY]
    changed = [s for s in sections if ours.get(s) != theirs.get(s)]
    if changed:
        raise KvplanError(
            "workload",
            f"recorded for another version of workload {ours['name']!r} ({', '.join(changed)} differ)",
            fix,
            source=str(baseline.path),
        )
    a, b = theirs.get("engine") or {}, ours.get("engine") or {}
    moved = [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
    return [f"engine settings differ from the baseline: {', '.join(moved)}"] if moved else []


def workload_tolerances(result: RunResult, run_dir: Path) -> dict[str, Tolerance]:
    """The run's workload ``gate:`` tolerances. Raises KvplanError naming a bad entry."""
    try:
        return Workload.model_validate(result.workload.config).gate.tolerances
    except ValidationError as err:
        field, problem = describe_error(err)
        raise KvplanError(f"workload.config.{field}", problem, source=str(run_dir / RESULTS_FILE)) from None


# ---- comparing ------------------------------------------------------------------------------
def compare(
    baseline: Baseline, current: dict[CheckKey, float | None], overrides: dict[str, Tolerance]
) -> tuple[Check, ...]:
    """Every baseline value against the run's, in the baseline's order. The tolerance of a
    metric is ``overrides`` (the workload's gate: section), else the baseline file's, else the
    catalog default."""
    checks = []
    for key, base in baseline.values.items():
        metric = METRICS_BY_NAME[key.metric]
        tol = metric.tolerance(overrides.get(key.metric) or baseline.tolerances.get(key.metric))
        worse = tol.worse
        assert worse is not None  # Metric.tolerance fills it in
        limit = tol.limit(metric.rank(base, worse))
        if metric.held_if_clean and _baseline_preempted(baseline, key):
            limit = math.inf if tol.worse == "higher" else -math.inf
        cur = current.get(key)
        missing = key not in current
        passed = not missing and tol.holds(metric.rank(cur, worse), limit)
        checks.append(Check(key, base, cur, tol, limit, passed, missing))
    return tuple(checks)


def _baseline_preempted(baseline: Baseline, key: CheckKey) -> bool:
    """Whether the baseline's level of ``key`` preempted (its KV use was bound by the pool)."""
    return bool(baseline.values.get(CheckKey("num_preemptions", key.bucket, key.level)))


def run_gate(run_dir: Path, baseline_path: Path) -> GateResult:
    """Compare a finished run with a baseline. Raises KvplanError on bad input (see module)."""
    run_dir = Path(run_dir)
    result = load_finished_run(run_dir)
    baseline = load_baseline(baseline_path)
    if not baseline.values:
        raise KvplanError(
            "values", "empty: a baseline that checks nothing cannot pass a run", RECORD, source=str(baseline_path)
        )
    notes = check_same_workload(baseline, result, run_dir)  # a list: more notes follow
    overrides = workload_tolerances(result, run_dir)
    current = read_values(result, str(run_dir / RESULTS_FILE))
    new = [k for k in current if k not in baseline.values]
    if new:
        notes.append(
            f"{len(new)} checks of this run are not in the baseline (e.g. {new[0].metric} at "
            f"{new[0].scope_label}); re-record it to gate them"
        )
    if overrides:
        notes.append(
            f"tolerances from the workload's gate: section (they win over the baseline file's): {', '.join(overrides)}"
        )
    checks = compare(baseline, current, overrides)
    unheld = [c for c in checks if math.isinf(c.limit) and METRICS_BY_NAME[c.key.metric].held_if_clean]
    if unheld:
        notes.append(
            f"{unheld[0].key.metric} not held at {len(unheld)} level(s) where the baseline preempted "
            f"(e.g. {unheld[0].key.scope_label}): the peak there was the pool's size, not the demand"
        )
    return GateResult(run_dir, baseline, checks, tuple(notes))


def record_baseline(run_dir: Path, baseline_path: Path) -> tuple[Path, int]:
    """Write a finished run as the baseline at ``baseline_path`` (kvplan.gate.baseline.write_baseline),
    with its workload's ``gate:`` tolerances; returns (path, values written)."""
    run_dir = Path(run_dir)
    result = load_finished_run(run_dir)
    return write_baseline(result, run_dir, baseline_path, workload_tolerances(result, run_dir))
