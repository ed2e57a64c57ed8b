"""kvplan's parts import one way, with no cycle anywhere, no module past 400 lines, no room too full.

The import graph is read from every module's AST (imports inside functions count too), so a
lazy import cannot hide a cycle. Direction rules (docs/architecture.md)::

    cli -> optimize -> run -> traffic -> workload -> results -> sizing     (each only downwards)
    gate: workload, results, sizing; profile: traffic, workload, results, sizing; schemas: workload, results
    errors, yaml_input: shared by all; engine imports nothing of kvplan
    sizing: no torch, transformers, triton or engine; results: no torch, transformers or triton

Inside run, one folder per kind of run (bundled engine, remote server, simulation); the kinds
import none of each other, and run's shared stages import none of them. run.loadtest, the bundled
engine's run, is the one module where two kinds meet (the simulated knee beside the measured one).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvplan", "engine")
MAX_LINES = 400
# the layers, top to bottom: a part may import the parts below it, never one above
ORDER = (
    "kvplan.cli",
    "kvplan.optimize",
    "kvplan.run",
    "kvplan.traffic",
    "kvplan.workload",
    "kvplan.results",
    "kvplan.sizing",
)
# parts beside the layers: what each may import (of kvplan's parts)
BESIDE = {
    "kvplan.schemas": ("kvplan.workload", "kvplan.results"),
    "kvplan.gate": ("kvplan.workload", "kvplan.results", "kvplan.sizing"),
    "kvplan.profile": ("kvplan.traffic", "kvplan.workload", "kvplan.results", "kvplan.sizing"),
}
SHARED = ("kvplan", "kvplan.errors", "kvplan.yaml_input")  # any part may import these
# part -> third-party packages (and engine) it must never import
NEVER = {
    "kvplan.sizing": ("engine", "torch", "transformers", "triton"),
    "kvplan.results": ("torch", "transformers", "triton"),
    "engine": ("kvplan",),
}
PARTS = ORDER + tuple(BESIDE)
MAX_MODULES = 15  # modules in one folder, its __init__ included
MAX_FOLDER_SHARE = 0.15  # of kvplan's lines in one folder's own modules
MAX_PART_SHARE = 0.25  # of kvplan's lines in one part, its subfolders included (issue 32's bound)

KINDS = ("kvplan.run.bundled", "kvplan.run.server", "kvplan.run.sim")
SHARED_MAY_IMPORT: set[str] = set()
KINDS_MEET = {"kvplan.run.loadtest"}


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
    """The module of ours that an import lands in (``kvplan.workload.schema.Workload`` -> its module)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


GRAPH = {name: {r for t in _imports(name, path) if (r := _resolve(t)) and r != name} for name, path in MODULES.items()}
EXTERNAL = {name: {t.split(".")[0] for t in _imports(name, path)} for name, path in MODULES.items()}


def part_of(name: str) -> str | None:
    """The part (ORDER or BESIDE) a module belongs to, or None (shared modules, the engine)."""
    return next((p for p in PARTS if name == p or name.startswith(p + ".")), None)


def may_import(part: str) -> set[str]:
    """The parts ``part`` may import besides itself and SHARED."""
    if part in BESIDE:
        return set(BESIDE[part])
    if part == "kvplan.cli":
        return set(PARTS) - {part}
    return set(ORDER[ORDER.index(part) + 1 :])


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` between kvplan's parts that the layer rules forbid, one line each."""
    broken = []
    for name, targets in graph.items():
        part = part_of(name)
        if part is None:
            continue
        allowed = may_import(part) | {part}
        bad = sorted(t for t in targets if (p := part_of(t)) is not None and p not in allowed)
        bad += sorted(t for t in targets if t.startswith("kvplan") and part_of(t) is None and t not in SHARED)
        if bad:
            broken.append(f"{name} imports {bad}")
    return broken


def test_the_parts_are_packages():
    for part in PARTS:
        if part != "kvplan.schemas":
            assert MODULES[part].name == "__init__.py"
    assert set(ORDER) | set(BESIDE) | set(SHARED) >= {
        n for n in MODULES if n.startswith("kvplan.") and n.count(".") == 1
    }


def test_imports_run_one_way():
    assert wrong_way(GRAPH) == []


def test_the_layer_rules_catch_a_wrong_way():
    graph = {
        "kvplan.workload.schema": {"kvplan.traffic.prompts", "kvplan.results.store", "kvplan.errors"},
        "kvplan.sizing.kv_math": {"kvplan.results.metrics"},
        "kvplan.gate.gate": {"kvplan.run.driver", "kvplan.workload.schema"},
        "kvplan.profile.log": {"kvplan.traffic.prompts", "kvplan.optimize.plan"},
        "kvplan.cli.plan": {"kvplan.optimize.plan", "kvplan.gate.view"},
        "kvplan.run.driver": {"kvplan.nowhere"},
    }
    assert wrong_way(graph) == [
        "kvplan.workload.schema imports ['kvplan.traffic.prompts']",
        "kvplan.sizing.kv_math imports ['kvplan.results.metrics']",
        "kvplan.gate.gate imports ['kvplan.run.driver']",
        "kvplan.profile.log imports ['kvplan.optimize.plan']",
        "kvplan.run.driver imports ['kvplan.nowhere']",
    ]


@pytest.mark.parametrize("part", sorted(NEVER))
def test_no_forbidden_package(part):
    broken = []
    for name in MODULES:
        if name == part or name.startswith(part + "."):
            bad = sorted(t for t in EXTERNAL[name] if any(t == f or t.startswith(f + ".") for f in NEVER[part]))
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
        elif name.startswith("kvplan.run.") and name not in KINDS_MEET:
            bad = {t for t in graph.get(name, ()) if _kind(t) is not None} - SHARED_MAY_IMPORT
        else:
            bad = set()
        if bad:
            broken.append(f"{name} imports {sorted(bad)}")
    return broken


def test_kinds_of_run_import_none_of_each_other_and_shared_stages_none_of_them():
    assert {"kvplan.run.driver", "kvplan.workload.schema", "kvplan.run.lifecycle"} <= set(MODULES)
    assert crossings(GRAPH, MODULES) == []


def test_the_kind_rules_catch_a_crossing():
    graph = {
        "kvplan.run.sim.x": {"kvplan.run.server.backend", "kvplan.run.driver", "kvplan.run.sim.cost"},
        "kvplan.run.driver": {"kvplan.run.bundled.backend"},
        "kvplan.workload.schema": {"kvplan.workload.server"},
        "kvplan.run.loadtest": {"kvplan.run.sim.search", "kvplan.run.bundled.backend"},
    }
    assert crossings(graph, graph) == [
        "kvplan.run.sim.x imports ['kvplan.run.server.backend']",
        "kvplan.run.driver imports ['kvplan.run.bundled.backend']",
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


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_folder_holds_too_much():
    """Small rooms: a folder holds at most MAX_MODULES modules and MAX_FOLDER_SHARE of kvplan's lines
    in its own modules, a part at most MAX_PART_SHARE with its subfolders."""
    ours = {n: p for n, p in MODULES.items() if n.startswith("kvplan")}
    total = sum(_lines(p) for p in ours.values())
    folders: dict[Path, list[Path]] = {}
    for path in ours.values():
        folders.setdefault(path.parent, []).append(path)
    crowded = {str(f): len(ps) for f, ps in folders.items() if len(ps) > MAX_MODULES}
    full = {
        str(f): round(s / total, 3)
        for f, ps in folders.items()
        if (s := sum(map(_lines, ps))) > MAX_FOLDER_SHARE * total
    }
    parts = {p: sum(_lines(q) for n, q in ours.items() if part_of(n) == p) / total for p in PARTS}
    assert (crowded, full, {p: round(v, 3) for p, v in parts.items() if v > MAX_PART_SHARE}) == ({}, {}, {})


def test_every_package_says_what_it_holds():
    """Each package's __init__ has a docstring, and docs/architecture.md names every package's folder."""
    architecture = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = [n for n, p in MODULES.items() if p.name == "__init__.py" and n.startswith("kvplan")]
    said = {n: (ast.get_docstring(ast.parse(MODULES[n].read_text(encoding="utf-8"))) or "").strip() for n in packages}
    silent = [n for n, doc in said.items() if len(doc) < 40]
    unnamed = [n for n in packages if "`" + n.replace(".", "/") + "/`" not in architecture]
    assert (silent, unnamed) == ([], [])


def test_no_module_over_400_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_front_page_stays_at_most_200_lines():
    """README.md is the front page: the two commands and one screen per command; the rest is docs/."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 200


def test_every_module_says_what_it_is():
    """The first docstring line of every kvplan module says what it holds."""
    silent = [
        n for n, p in MODULES.items() if n.startswith("kvplan") and not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert silent == []
