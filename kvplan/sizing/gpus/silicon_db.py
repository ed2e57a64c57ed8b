"""What aiconfigurator-core's measured database holds (for kvplan.sizing.gpus.silicon): whether it is
installed, its systems' database versions by backend, the version it maintains as current, and
how many GPUs one tensor-parallel group of a system spans over NVLink. Read once per process.
"""

from __future__ import annotations

import logging
from functools import cache


def available() -> bool:
    """Whether aiconfigurator-core is installed."""
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        return False
    return True


def package_version() -> str:
    """aiconfigurator-core's installed version ("" where it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiconfigurator-core")
    except PackageNotFoundError:
        return ""


def database_versions(system: str, backend: str) -> list[str]:
    """The database versions aiconfigurator-core holds for ``system`` and ``backend``, oldest
    first ([] where none, or where it is not installed)."""
    return list(_database_versions(system, backend))


@cache
def _database_versions(system: str, backend: str) -> tuple[str, ...]:
    if not available():
        return ()
    return tuple(sorted(_supported_databases().get(system, {}).get(backend, []), key=_version_key))


@cache
def _supported_databases() -> dict[str, dict[str, list[str]]]:
    """aiconfigurator-core's listing of its databases (system -> backend -> versions), read once
    per process. It reads some 500 YAML files per call (1.2-2.4 s here) and is called again inside
    ``get_latest_database_version``; the files do not change while kvplan runs, so the module's
    function is replaced by this memoised one on first use."""
    from aiconfigurator_core.sdk import perf_database

    read = perf_database.get_supported_databases
    with quiet():
        listing = read()
    perf_database.get_supported_databases = lambda systems_paths=None: (
        listing if systems_paths is None else read(systems_paths)
    )
    return listing


@cache
def default_version(system: str, backend: str) -> str | None:
    """The database version of ``system`` / ``backend`` aiconfigurator maintains as current (its
    ``get_latest_database_version``: the ``current`` version slot where one is set, else the
    newest with data; vLLM 0.24.0 on h100_sxm in 0.12.0), None where there is none (cached per
    process)."""
    if not database_versions(system, backend):
        return None
    from aiconfigurator_core.sdk.perf_database import get_latest_database_version

    with quiet():
        return get_latest_database_version(system, backend)


@cache
def nvlink_domain(system: str) -> int:
    """GPUs of aiconfigurator ``system`` that one tensor-parallel group can span over NVLink: its
    system YAML's ``num_gpus_per_rack`` where it gives one (GB200 NVL72: 72), else
    ``num_gpus_per_node`` (H100 SXM: 8); 0 where neither is given or it is not installed. Past it,
    all-reduce crosses the network, which the database does not measure."""
    if not available():
        return 0
    from importlib.resources import files

    import yaml

    from kvplan.yaml_input import load_data

    entry = files("aiconfigurator_core") / "systems" / f"{system}.yaml"
    try:
        node = (load_data(entry.read_text()) or {}).get("node") or {}
    except (OSError, yaml.YAMLError):
        return 0
    return int(node.get("num_gpus_per_rack") or node.get("num_gpus_per_node") or 0)


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in version.replace("rc", ".").replace("post", ".").split("."))


class quiet:
    """aiconfigurator logs its data loading at INFO/WARNING; a simulation prints its own lines."""

    def __enter__(self) -> None:
        self._level = logging.root.manager.disable
        logging.disable(logging.WARNING)

    def __exit__(self, *exc: object) -> None:
        logging.disable(self._level)
