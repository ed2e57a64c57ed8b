"""Views of a GateResult: the rich table on the console and JUnit XML for CI systems.

The console ends with one line ``gate: N passed, M failed`` (the plain count CI log readers
look for); each regression is also listed on its own line above it, so a long table need not be
scrolled. The JUnit file has one test suite per gate run and one test case per check, named by
metric and level, classed by workload and bucket, written with junitparser.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from kvplan.errors import KvplanError
from kvplan.gate.gate import Check, GateResult
from kvplan.results.gated import METRICS_BY_NAME

if TYPE_CHECKING:
    from rich.console import JustifyMethod


def format_value(value: float | None) -> str:
    """``none`` for a missing value, whole numbers with thousands separators, else 2 decimals."""
    if value is None:
        return "none"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"


def format_limit(check: Check) -> str:
    """The worst passing value; ``none`` when only a missing value passes (no knee), ``any``
    when the baseline had no value to hold."""
    if math.isinf(check.limit):
        return "none" if check.baseline is None and METRICS_BY_NAME[check.key.metric].none_is_best else "any"
    return format_value(check.limit)


def verdict(check: Check) -> str:
    return "ok" if check.passed else "missing" if check.missing else "REGRESSION"


def describe_failure(check: Check) -> str:
    """One line: what moved, how far it may move, and the limit it crossed."""
    unit = METRICS_BY_NAME[check.key.metric].unit
    head = f"{check.key.metric} [{check.key.scope_label}]: baseline {format_value(check.baseline)}"
    if check.missing:
        return f"{head} {unit}, but this run has no such {'level' if check.key.level else 'bucket'}"
    return (
        f"{head}, current {format_value(check.current)} {unit}, limit {format_limit(check)} "
        f"(tolerance {check.tolerance.describe()}, worse: {check.tolerance.worse})"
    )


def render_gate(result: GateResult, console) -> None:
    """Print the notes, the table of every check, the regressions and the closing count."""
    from rich.table import Table

    line = {"markup": False, "highlight": False, "soft_wrap": True}  # plain lines, never wrapped
    recorded = result.baseline.recorded
    console.print(
        f"baseline: {result.baseline.path} (recorded {recorded.get('started_at', '?')} "
        f"from {recorded.get('run_dir', '?')}, {recorded.get('platform', '?')})",
        **line,
    )
    for note in result.notes:
        console.print(f"note: {note}", style="yellow", **line)
    table = Table(title=f"kvplan gate: {result.run_dir}", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("metric", "left"),
        ("bucket", "left"),
        ("baseline", "right"),
        ("current", "right"),
        ("tolerance", "right"),
        ("limit", "right"),
        ("verdict", "left"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name in ("metric", "verdict"))
    for c in result.checks:
        style = "green" if c.passed else "bold red"
        table.add_row(
            c.key.metric,
            c.key.scope_label,
            format_value(c.baseline),
            "missing" if c.missing else format_value(c.current),
            c.tolerance.describe(),
            format_limit(c),
            f"[{style}]{verdict(c)}[/{style}]",
        )
    console.print(table)
    for c in result.regressions:
        console.print(f"REGRESSION {describe_failure(c)}", style="red", **line)
    passed = len(result.checks) - len(result.regressions)
    console.print(f"gate: {passed} passed, {len(result.regressions)} failed", **line)


def write_junit(result: GateResult, path: Path) -> None:
    """JUnit XML at ``path`` (folders made as needed): one test case per check, a failure
    element on each regression. Raises KvplanError when the file cannot be written."""
    from junitparser import Failure, JUnitXml, TestCase, TestSuite

    workload = result.baseline.workload_name
    suite = TestSuite(f"kvplan gate {workload}")
    suite.add_property("run_dir", str(result.run_dir))
    suite.add_property("baseline", str(result.baseline.path))
    cases = []
    for c in result.checks:
        name = c.key.metric + (f" [{c.key.level}]" if c.key.level else "")
        case = TestCase(name, classname=f"kvplan.gate.{workload}.{c.key.bucket or 'run'}", time=0.0)
        if not c.passed:
            case.result = [Failure(describe_failure(c), type_=verdict(c).lower())]
        cases.append(case)
    suite.add_testcases(cases)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.update_statistics()
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        xml.write(str(path), pretty=True)
    except OSError as err:  # a parent that is a file: mkdir's 'File exists', once the whole line
        blocked = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        problem = (
            f"{blocked} is a file, so {path} cannot be written"
            if blocked
            else f"cannot write {path} ({err.strerror or err})"
        )
        raise KvplanError("junit", problem, "give a file path in a folder you can write, e.g. gate-junit.xml") from None
