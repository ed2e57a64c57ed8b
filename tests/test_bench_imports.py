"""Every name a bench script imports from kvplan or engine exists.

The bench scripts run by hand and in no test, so a module moved inside kvplan (issue 32's rooms moved
``kvplan.run.sim.calibrations`` to ``kvplan.run.sim.calibration.store``) broke
bench/ship_calibration.py and bench/sim_calibration.py at their first line unnoticed. This reads each
script's ``from kvplan... import`` and ``from engine... import`` statements (at any depth, so the ones
inside functions too) and imports them here, without running the scripts.
"""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


def project_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of each ``from kvplan|engine... import name`` in the script."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in ("kvplan", "engine"):
                found += [(node.lineno, node.module, alias.name) for alias in node.names]
    return found


def test_the_scripts_are_read():
    assert len(SCRIPTS) >= 20
    assert ("kvplan.run.sim.calibration", "store") in {
        (module, name) for _, module, name in project_imports(ROOT / "bench" / "ship_calibration.py")
    }


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_name_a_bench_script_imports_exists(path):
    missing = []
    for line, module, name in project_imports(path):
        try:
            imported = importlib.import_module(module)
        except ImportError as err:
            missing.append(f"{path.name}:{line}: {module} ({err})")
            continue
        if not hasattr(imported, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{path.name}:{line}: {module} has no {name}")
    assert not missing, missing
