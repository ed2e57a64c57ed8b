"""kvplan's parts import one way, with no cycle anywhere, and no module grows past 400 lines.

The import graph is read from every module's AST (imports inside functions count too), so a
lazy import cannot hide a cycle. Direction rules (docs/architecture.md)::

    cli, schemas -> gate -> load -> results -> plan          engine imports nothing of kvplan
    plan: no torch, transformers, triton or engine; results: no torch, transformers or triton

Inside load, one folder per kind of run (bundled engine, remote target, simulation); the kinds
import none of each other, and the stages every run shares import none of them, but for the
workload schema's ``target:`` section (load.target.settings). load.loadtest, the bundled engine's
run, is the one module where two kinds meet (the simulated knee beside the measured one).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvplan", "engine")
MAX_LINES = 400
# part -> parts (and third-party packages) it must never import
FORBIDDEN = {
    "kvplan.plan": (
        "kvplan.load",
        "kvplan.results",
        "kvplan.gate",
        "kvplan.cli",
        "engine",
        "torch",
        "transformers",
        "triton",
    ),
    "kvplan.results": ("kvplan.load", "kvplan.gate", "kvplan.cli", "torch", "transformers", "triton"),
    "kvplan.load": ("kvplan.gate", "kvplan.cli"),
    "kvplan.gate": ("kvplan.cli",),
    "engine": ("kvplan",),
}


KINDS = ("kvplan.load.bundled", "kvplan.load.target", "kvplan.load.sim")
# shared stages may import these of a kind: the workload's target: section is part of the schema
SHARED_MAY_IMPORT = {"kvplan.load.target", "kvplan.load.target.settings"}
KINDS_MEET = {"kvplan.load.loadtest"}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every absolute module name ``name`` imports (``from a import b`` gives a and a.b)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def _resolve(target: str) -> str | None:
    """The module of ours that an import lands in (``kvplan.load.workload.Workload`` -> its module)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


GRAPH = {name: {r for t in _imports(name, path) if (r := _resolve(t)) and r != name} for name, path in MODULES.items()}
EXTERNAL = {name: {t.split(".")[0] for t in _imports(name, path)} for name, path in MODULES.items()}


def test_the_parts_are_packages():
    for part in ("plan", "load", "results", "gate"):
        assert MODULES[f"kvplan.{part}"].name == "__init__.py"


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_imports_run_one_way(part):
    broken = []
    for name in MODULES:
        if name != part and not name.startswith(part + "."):
            continue
        reached = GRAPH[name] | EXTERNAL[name]
        bad = sorted(t for t in reached for f in FORBIDDEN[part] if t == f or t.startswith(f + "."))
        if bad:
            broken.append(f"{name} imports {bad}")
    assert not broken, "\n".join(broken)


def _kind(name: str) -> str | None:
    return next((k for k in KINDS if name == k or name.startswith(k + ".")), None)


def test_the_kinds_of_run_are_folders():
    for kind in KINDS:
        assert MODULES[kind].name == "__init__.py"


def crossings(graph: dict[str, set[str]], modules) -> list[str]:
    """The imports of ``graph`` that break the kind rules, one line each, for ``modules``."""
    broken = []
    for name in modules:
        kind = _kind(name)
        if kind is not None:
            bad = {t for t in graph.get(name, ()) if _kind(t) not in (None, kind)}
        elif name.startswith("kvplan.load.") and name not in KINDS_MEET:
            bad = {t for t in graph.get(name, ()) if _kind(t) is not None} - SHARED_MAY_IMPORT
        else:
            bad = set()
        if bad:
            broken.append(f"{name} imports {sorted(bad)}")
    return broken


def test_kinds_of_run_import_none_of_each_other_and_shared_stages_none_of_them():
    assert {"kvplan.load.driver", "kvplan.load.workload", "kvplan.load.lifecycle"} <= set(MODULES)
    assert crossings(GRAPH, MODULES) == []


def test_the_kind_rules_catch_a_crossing():
    graph = {
        "kvplan.load.sim.x": {"kvplan.load.target.backend", "kvplan.load.driver", "kvplan.load.sim.cost"},
        "kvplan.load.driver": {"kvplan.load.bundled.backend"},
        "kvplan.load.workload": {"kvplan.load.target.settings"},
        "kvplan.load.loadtest": {"kvplan.load.sim.search", "kvplan.load.bundled.backend"},
    }
    assert crossings(graph, graph) == [
        "kvplan.load.sim.x imports ['kvplan.load.target.backend']",
        "kvplan.load.driver imports ['kvplan.load.bundled.backend']",
    ]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: Tarjan's strongly connected components of more than one module."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    return found


def test_no_import_cycle():
    """Package faces (``__init__``) included: a loop through one is a loop."""
    assert cycles(GRAPH) == []


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"e2"}, "e2": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"x": {"y"}, "y": {"x"}, "z": set()}) == [["x", "y"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_no_module_over_400_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
