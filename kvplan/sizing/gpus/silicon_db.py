"""What aiconfigurator-core's measured database holds (for kvplan.sizing.gpus.silicon): whether it is
installed, its systems' database versions by backend, the version it maintains as current, and
how many GPUs one tensor-parallel group of a system spans over NVLink. Read once per process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import defaultdict
from functools import cache
from pathlib import Path


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
    function is replaced by this memoised one on first use. The listing is also kept on disk
    (``_listing_file``), keyed by the package's version and its systems folders' times, so a
    later process reads one small JSON file instead."""
    from aiconfigurator_core.sdk import perf_database

    read = perf_database.get_supported_databases
    stored = _listing_file(perf_database.get_systems_paths())
    listing = _read_listing(stored)
    if listing is None:
        with quiet():
            listing = read()
        _write_listing(stored, listing)
    perf_database.get_supported_databases = lambda systems_paths=None: (
        listing if systems_paths is None else read(systems_paths)
    )
    return listing


def _listing_file(systems_paths: list[str]) -> Path:
    """Where the listing of these systems folders is kept: ``$KVPLAN_CACHE`` (default
    ~/.cache/kvplan) ``/aiconfigurator/databases-<key>.json``, the key a hash of the package's
    version and every systems folder's path and the times of its entries, so a new version or a
    changed folder is read afresh."""
    stamp = [package_version()]
    for root in systems_paths:
        try:
            entries = sorted(os.scandir(root), key=lambda e: e.name)
            stamp += [root, *(f"{e.name}:{e.stat().st_mtime_ns}" for e in entries)]
        except OSError:
            stamp.append(f"{root}:missing")
    key = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("KVPLAN_CACHE") or Path.home() / ".cache" / "kvplan")
    return folder / "aiconfigurator" / f"databases-{key}.json"


def _read_listing(path: Path) -> dict[str, dict[str, list[str]]] | None:
    """The listing kept at ``path`` as aiconfigurator returns it (nested defaultdicts: a system
    or backend it lacks reads as empty); None where there is none or it cannot be read."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict):
        return None
    listing: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for system, backends in stored.items():
        listing[system].update(backends)
    return listing


def _write_listing(path: Path, listing: dict[str, dict[str, list[str]]]) -> None:
    """Keep ``listing`` at ``path``, written whole or not at all (a cache: a failure is ignored)."""
    _write_json(path.parent, path, listing)


def _read_json(path: Path) -> dict:
    """The JSON object kept at ``path``; {} where there is none or it cannot be read."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _write_json(folder: Path, path: Path, data: dict) -> None:
    """Keep ``data`` at ``path`` in ``folder``, written whole or not at all (a cache: a failure is
    ignored)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(data, sort_keys=True))
        partial.replace(path)
    except OSError:
        pass


@cache
def default_version(system: str, backend: str) -> str | None:
    """The database version of ``system`` / ``backend`` aiconfigurator maintains as current (its
    ``get_latest_database_version``: the ``current`` version slot where one is set, else the
    newest with data; vLLM 0.24.0 on h100_sxm in 0.12.0), None where there is none (cached per
    process, and kept on disk beside the listing, ``current-<key>.json`` under the listing's key:
    finding it reads some 30 YAML files, 0.5 s here)."""
    if not database_versions(system, backend):
        return None
    from aiconfigurator_core.sdk import perf_database

    listing = _listing_file(perf_database.get_systems_paths())
    stored = listing.with_name(listing.name.replace("databases-", "current-"))
    kept = _read_json(stored)
    if isinstance(kept.get(f"{system}/{backend}"), str):
        return kept[f"{system}/{backend}"]
    with quiet():
        version = perf_database.get_latest_database_version(system, backend)
    if version is not None:  # kept beside the listing, under its key (0.5 s of YAML reads per process)
        _write_json(stored.parent, stored, {**kept, f"{system}/{backend}": version})
    return version


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
