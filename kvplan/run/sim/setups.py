"""What ``kvplan simulate`` simulates, and with which clock: the workload's own engine timed by a
calibration (shipped, or fitted on a run folder), or by a measured run's own step times (replay).
A GPU the engine never ran on is kvplan.run.sim.gpu_target."""

from __future__ import annotations

from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.results.simulated import CostModelInfo
from kvplan.run.sim.calibration import store as calibrations
from kvplan.run.sim.calibration.store import Calibrated, Calibration
from kvplan.run.sim.cost import ModelClock
from kvplan.run.sim.facts import simulated_facts
from kvplan.run.sim.replay import ReplayClock
from kvplan.run.sim.run import SimSetup
from kvplan.workload.schema import Workload


def calibrated_setup(workload: Workload, calibration: Calibration) -> SimSetup:
    """The workload's engine, each step timed by ``calibration``'s model.

    Raises:
        KvplanError: a calibration of another engine (``engine.<field>``), or engine settings the
            engine would refuse.
    """
    calibrations.check_engine(calibration, workload)
    engine = calibration.engine
    facts = simulated_facts(workload, str(engine["device"]), str(engine["attention_backend"]))
    model = calibration.model
    info = CostModelInfo(
        kind="calibrated",
        step_times="calibrated",
        description=f"step time fitted on {calibration.num_steps:,} measured steps (R² {calibration.r2:.3f})",
        source=calibration.source,
        machine=calibration.machine,
        r2=calibration.r2,
        parameters={"intercept_s": model.intercept_s, "coefficients": model.coefficients, "gap_s": model.gap_s},
    )
    return SimSetup(facts, lambda: ModelClock(model), info)


def engine_setup(workload: Workload, calibrate: Path | None = None) -> tuple[SimSetup, Calibrated | None]:
    """``calibrated_setup`` with the shipped calibration of the workload's engine, or one fitted on
    the run folder ``calibrate`` (returned too, with its fit and drift check, to show).

    Raises:
        KvplanError: no shipped calibration for the engine, a run folder that cannot calibrate, a
            calibration of another engine.
    """
    if calibrate is None:
        return calibrated_setup(workload, calibrations.default_for(workload)), None
    calibrated = calibrations.from_run(calibrate)
    return calibrated_setup(workload, calibrated.calibration), calibrated


def replay_setup(workload: Workload, run_dir: Path) -> SimSetup:
    """The workload's engine, every step taking the measured run's own start and end
    (kvplan.run.sim.replay): the simulator's exactness check.

    Raises:
        KvplanError: a run folder that cannot be read, or one that is not a measured run.
    """
    from kvplan.results.run_result import load_run

    data = load_run(run_dir)
    if data.result.source != "measured" or data.result.engine is None:
        raise KvplanError("replay", f"{run_dir} is a {data.result.source} run", "replay a measured load test")
    engine = data.result.engine
    facts = simulated_facts(workload, engine.device, engine.attention_backend)
    info = CostModelInfo(
        kind="replay",
        step_times="replay",
        description="the measured run's own step times",
        source=str(run_dir),
        machine=data.result.run.platform,
    )
    measured = frozenset(r.key.id for r in data.requests)
    return SimSetup(facts, lambda: ReplayClock(data.steps, data.requests), info, timed=False, levels=measured)
