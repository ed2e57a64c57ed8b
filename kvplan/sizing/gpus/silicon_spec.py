"""aiconfigurator-core's compiled engine for one silicon target, kept on disk across processes.

Building the engine (kvplan.sizing.gpus.silicon ``_build_engine``) reads the target's measured
database in Python (``get_database``, 0.4-0.6 s here) and walks the model's operations into an
``EngineSpec`` (``build_engine_spec_json``, 0.5-0.9 s: resolving each attention operation's
kernel lanes against the database), then hands the spec's bytes to the Rust ``AicEngine``, which
loads its own tables. The bytes depend only on the package's data and the target, so they are kept
under ``$KVPLAN_CACHE`` (default ~/.cache/kvplan) ``/aiconfigurator/engine-<key>.bin``, the key a
hash of the database listing's key (the package's version and its systems folders' times,
kvplan.sizing.gpus.silicon_db) and the target (system, backend, database version, model config,
parallelism, precisions). A later process builds the handle from the same bytes
(``EngineHandle(spec_bytes, systems_path=...)``, as aiconfigurator's own ``_cached_engine_handle``
does after compiling): the same engine, so every step time is the same. ``warm_up`` then asks it
one step of each kind, side by side on threads (its first answers load its tables).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

_FORMAT = b"kvplan-aic-engine-1\n"


def spec_file(identity: dict[str, Any]) -> Path:
    """Where the engine of ``identity`` (a JSON-able description of the target) is kept: beside
    the database listing, under its key (so a new package version or changed systems folder
    builds afresh) and a hash of ``identity``."""
    from aiconfigurator_core.sdk import perf_database

    from kvplan.sizing.gpus.silicon_db import _listing_file

    listing = _listing_file(perf_database.get_systems_paths())
    text = json.dumps([listing.name, identity], sort_keys=True)
    return listing.with_name(f"engine-{hashlib.sha256(text.encode()).hexdigest()[:24]}.bin")


def memo_file(identity: dict[str, Any]) -> Path:
    """Where the step times of the engine of ``identity`` are kept (kvplan.sizing.gpus.silicon_memo):
    beside its spec, under the same key."""
    spec = spec_file(identity)
    return spec.with_name("steps-" + spec.name.removeprefix("engine-").removesuffix(".bin") + ".bin")


def stored_handle(identity: dict[str, Any]) -> Any | None:
    """The ``EngineHandle`` of ``identity`` from its kept spec bytes; None where none is kept, the
    file is not one this module wrote whole, or its systems folder is gone (then build it)."""
    path = spec_file(identity)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.startswith(_FORMAT) or b"\n" not in data[len(_FORMAT) :]:
        return None
    header, spec = data[len(_FORMAT) :].split(b"\n", 1)
    try:
        kept = json.loads(header)
        systems_path, size = kept["systems_path"], kept["size"]
    except (ValueError, KeyError, TypeError):
        return None
    if size != len(spec) or (systems_path is not None and not os.path.isdir(systems_path)):
        return None
    from aiconfigurator_core.sdk.engine import EngineHandle
    from aiconfigurator_core.sdk.rust_engine_step import _configure_default_data_roots

    _configure_default_data_roots()  # the environment a freshly compiled handle is built in
    return EngineHandle(spec, systems_path=systems_path)


def keep_handle(identity: dict[str, Any], handle: Any) -> None:
    """Keep ``handle``'s spec bytes and systems folder for ``identity``, written whole or not at
    all (a cache: a failure, or a handle without them, is ignored)."""
    spec, systems_path = getattr(handle, "spec_bytes", None), getattr(handle, "_systems_path", None)
    if not isinstance(spec, bytes) or not (systems_path is None or isinstance(systems_path, str)):
        return
    path = spec_file(identity)
    header = json.dumps({"systems_path": systems_path, "size": len(spec)}).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(_FORMAT + header + b"\n" + spec)
        partial.replace(path)
    except OSError:
        pass


def engine_handle(model: Any, system: str, backend: str, version: str, identity: dict[str, Any] | None) -> Any:
    """aiconfigurator-core's ``EngineHandle`` of the built ``model`` on ``system`` / ``backend``
    ``version``'s database: the one kept for ``identity`` where there is one, else compiled from
    the database (``get_database`` and ``_cached_engine_handle``, as before) and kept (None: never
    kept nor read).

    Raises:
        RuntimeError: aiconfigurator has no database for the target.
    """
    handle = stored_handle(identity) if identity is not None else None
    if handle is not None:
        return handle
    from aiconfigurator_core.sdk.perf_database import get_database
    from aiconfigurator_core.sdk.rust_engine_step import _cached_engine_handle

    database = get_database(system, backend, version)
    if database is None:
        raise RuntimeError(f"no database for {system} / {backend} {version}")
    handle = _cached_engine_handle(model, database)
    if identity is not None:
        keep_handle(identity, handle)
    return handle


def warm_up(handle: Any, context: dict[str, list[int]], generation: dict[str, list[int]]) -> None:
    """One evaluation of each kind of ``handle``'s operations (generation non-attention with the
    LM head, generation attention, context non-attention, context attention: ``context`` and
    ``generation`` their positions by role), so a shape or precision its database lacks fails
    now. Each first evaluation loads the measured tables its operations read (about 0.3 s apiece
    here); the engine releases the GIL meanwhile, so the four run side by side (0.9 s one after
    another, 0.55 s on 2 cores).

    Raises:
        Exception: what aiconfigurator raises, the first evaluation's in the order above.
    """
    shared = generation["non_attention"] + generation["logits"]
    first_calls(
        lambda: handle.evaluate_generation_ops(shared, batch_size=8, s=1024),
        lambda: handle.evaluate_generation_ops(generation["attention"], batch_size=8, s=1024),
        lambda: handle.evaluate_context_ops(context["non_attention"], batch_size=1, s=1024, x=1024),
        lambda: handle.evaluate_context_ops(context["attention"], batch_size=1, s=1024, prefix=0),
    )


def first_calls(*calls: Callable[[], Any]) -> None:
    """Run ``calls`` on threads of their own and wait for all of them.

    Raises:
        BaseException: the first call's error in the order given (as one after another would
            raise it), once every call has ended.
    """
    errors: list[BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            calls[i]()
        except BaseException as err:  # noqa: BLE001 - raised below, on the caller's thread
            errors[i] = err

    threads = [threading.Thread(target=run, args=(i,), name=f"kvplan-silicon-warm-up-{i}") for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for err in errors:
        if err is not None:
            raise err
