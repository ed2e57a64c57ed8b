"""``kvplan simulate``'s options turned into what to simulate: one function the CLI calls.

One of three clocks for the workload's own engine (the shipped calibration, ``calibrate`` on a run
folder, ``replay`` of a measured run), or a GPU the engine never ran on (``model`` and ``gpu``);
plus, for the workload's engine, the ``plan:`` entries whose GPUs have speed figures.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.run.sim.calibration.store import Calibrated
from kvplan.run.sim.setups import SimSetup
from kvplan.workload.schema import Workload

STEP_TIMES = ("auto", "silicon", "roofline")


def setups_for(
    workload: Workload,
    *,
    calibrate: Path | None = None,
    model: str | None = None,
    gpu: str | None = None,
    tp: int = 1,
    kv_cache_dtype: str = "auto",
    weight_dtype: str = "auto",
    gpu_memory_utilization: float | None = None,
    replay: Path | None = None,
    attainment: float = 0.95,
    backend: str = "vllm",
    backend_version: str | None = None,
    ep: int = 1,
    step_times: str = "auto",
    dp: int = 1,
    tokenize_us_per_token: float = 0.0,
) -> tuple[SimSetup, tuple[SimSetup, ...], Calibrated | None]:
    """(the setup to simulate, the plan targets to answer for, the calibration fitted on
    ``calibrate`` if given). Options are named by their fields. The setup's notes carry one line
    per ``plan:`` entry skipped (no speed figures for its GPU), or one saying the entries are not
    simulated beside ``replay`` or ``gpu``.

    Raises:
        KvplanError: options that contradict (``model`` without ``gpu``, ``calibrate`` with ``gpu``
            or ``replay``, GPU options without ``gpu``), an attainment outside (0, 1], and whatever
            the chosen setup raises.
    """
    from kvplan.run.sim import gpu_target, setups
    from kvplan.sizing.gpus.silicon import check_backend

    backend = check_backend(backend)  # an unknown name fails whatever the clock
    step_times = step_times.strip().lower()  # any case, as the backend and dtype names
    if step_times not in STEP_TIMES:
        raise KvplanError("step_times", f"unknown choice {step_times!r}", f"use one of {', '.join(STEP_TIMES)}")
    if not 0 < attainment <= 1:
        raise KvplanError("attainment", f"must be in (0, 1] (got {attainment})", "give a fraction such as 0.95")
    if (model is None) != (gpu is None):
        given, missing = ("model", "gpu") if gpu is None else ("gpu", "model")
        raise KvplanError(
            missing, f"`{given}` needs `{missing}` too", "give both, or neither to simulate the workload's engine"
        )
    clocks = [name for name, value in (("calibrate", calibrate), ("replay", replay), ("gpu", gpu)) if value]
    if len(clocks) > 1:
        raise KvplanError(clocks[1], f"given with `{clocks[0]}`; each sets how steps are timed", "give one of them")
    if gpu is None:
        unused = [
            name
            for name, value, default in (
                ("tp", tp, 1),
                ("kv_cache_dtype", kv_cache_dtype, "auto"),
                ("weight_dtype", weight_dtype, "auto"),
                ("gpu_memory_utilization", gpu_memory_utilization, None),
                ("backend", backend, "vllm"),
                ("backend_version", backend_version, None),
                ("ep", ep, 1),
                ("dp", dp, 1),
                ("step_times", step_times, "auto"),
                ("tokenize_us_per_token", tokenize_us_per_token, 0.0),
            )
            if value != default
        ]
        if unused:
            raise KvplanError(unused[0], "applies to a simulated GPU only", "give `model` and `gpu`, or drop it")
        if replay is not None:
            if workload.engine.disagg is not None:
                raise KvplanError("replay", "does not replay engine.disagg (its runs record no steps)", "drop it")
            return _unplanned(setups.replay_setup(workload, replay), workload, "--replay"), (), None
        setup, calibrated = setups.engine_setup(workload, calibrate)
        plan, skipped = gpu_target.plan_setups(workload)
        return replace(setup, notes=(*setup.notes, *skipped)), tuple(plan), calibrated
    assert model is not None  # given with gpu (checked above)
    if Path(model).exists():  # a command-line path is the shell's: relative to the current folder
        model = str(Path(model).resolve())
    setup = gpu_target.gpu_setup(
        workload,
        model,
        gpu,
        tp,
        kv_cache_dtype,
        weight_dtype,
        gpu_memory_utilization,
        backend=backend,
        backend_version=backend_version,
        ep=ep,
        step_times=step_times,
        dp=dp,
        tokenize_us_per_token=tokenize_us_per_token,
    )
    if workload.engine.disagg is not None:  # the bundled engine's pools: a GPU target is one replica
        note = "engine.disagg not simulated: --model/--gpu simulates one aggregated replica; for a"
        note += " disaggregated GPU target give a plan: entry with disagg: (docs/simulate.md, Disaggregated targets)"
        setup = replace(setup, notes=(*setup.notes, note))
    return _unplanned(setup, workload, "--model/--gpu"), (), None


def _unplanned(setup: SimSetup, workload: Workload, flags: str) -> SimSetup:
    """``setup`` with a note saying the workload's ``plan:`` entries are not answered for (they
    are answered beside the workload's own engine only)."""
    if not workload.plan:
        return setup
    entries = f"{len(workload.plan)} plan: entr{'y' if len(workload.plan) == 1 else 'ies'}"
    note = f"{entries} not simulated: {flags} simulates that target alone; drop it to answer for them"
    return replace(setup, notes=(*setup.notes, note))
