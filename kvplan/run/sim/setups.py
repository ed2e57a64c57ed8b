"""What ``kvplan simulate`` simulates, and with which clock (SimSetup): the workload's own engine
timed by a calibration (shipped, or fitted on a run folder), or by a measured run's own step times
(replay). A GPU the engine never ran on is built by kvplan.run.sim.gpu_target.gpu_setup; the
CLI's options are read into setups by kvplan.run.sim.cli_setup."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.results.run_result import EngineFacts
from kvplan.results.simulated import CostModelInfo
from kvplan.run.driver import Level
from kvplan.run.sim.calibration import store as calibrations
from kvplan.run.sim.calibration.store import Calibrated, Calibration
from kvplan.run.sim.cost import ModelClock, StepClock, StepJitter
from kvplan.run.sim.facts import simulated_facts
from kvplan.run.sim.replay import ReplayClock
from kvplan.sizing.gpus.offload import machine_tier_links
from kvplan.workload.schema import Workload


@dataclass(frozen=True)
class SimSetup:
    """One thing to simulate: the engine it stands for (``facts``: pool, limits, model dims), a
    factory of fresh clocks (one per simulation), how they time steps, and which target it is
    (``engine`` or ``plan[i]``, with its GPU and tp)."""

    facts: EngineFacts
    clock: Callable[[], StepClock]
    cost_model: CostModelInfo
    target: str = "engine"
    gpu: str | None = None
    tp: int = 1
    timed: bool = True  # its clock times any level (False for a replay, which knows the measured levels only)
    notes: tuple[str, ...] = ()  # one line each the CLI prints (a GPU target timed by the roofline: why)
    weight_dtype: str | None = None  # a GPU target's: as given, canonical (auto: the checkpoint's own)
    ep: int = 1  # a GPU target's expert-parallel size
    dp: int = 1  # a GPU target's attention data-parallel size (tp x dp GPUs per instance)
    backend: str | None = None  # a GPU target's serving engine (vllm, sglang, trtllm)
    levels: frozenset[str] | None = None  # a replay's: the ids of the levels the measured run ran (None: all)
    # a disaggregated target's: a fresh backend of its two pools (kvplan.run.sim.disagg); None: one engine
    make_backend: Callable[[], Any] | None = None
    disagg: str | None = None  # a disaggregated target's shape: ``2P tp2 + 3D tp4 over rdma-400g``

    def own_levels(self, levels: list[Level]) -> list[Level]:
        """The ``levels`` this setup can simulate: a replay's, those the measured run ran (a load test
        of a mix bucket without ``interference`` ran no class alone); else all of them."""
        return levels if self.levels is None else [lv for lv in levels if lv.key.id in self.levels]

    def sized(self, workload: Workload) -> Workload:
        """``workload`` with this target's pool (what the estimate reads)."""
        pool = {"num_blocks": self.facts.num_blocks, "block_size": self.facts.block_size, "kv_cache_memory": None}
        engine = workload.engine.model_copy(update=pool)
        return workload.model_copy(update={"engine": engine})

    def with_facts(self, facts: EngineFacts) -> SimSetup:
        """This setup's clock and cost model on another engine's ``facts`` (an engine change that
        leaves step times alone, such as a larger pool)."""
        return replace(self, facts=facts)


def calibrated_setup(workload: Workload, calibration: Calibration) -> SimSetup:
    """The workload's engine, each step timed by ``calibration``'s model (with offload tiers on the
    CPU, each step's loads priced by this machine's fitted copies: ``machine_tier_links``); for a calibration fitted
    on a server's run (``--calibrate`` of a ``--target`` run), on that server's pool: its usable
    blocks (kvplan.run.sim.calibration.store.server_pool) of its block size, each request reaching
    its scheduler the server's front-end latency after it is sent (``front_end_s``), each step
    its model's seconds plus a residual drawn from the server's measured ones (``jitter_s``,
    kvplan.run.sim.cost.StepJitter).

    Raises:
        KvplanError: a calibration of another engine (``engine.<field>``), or engine settings the
            engine would refuse.
    """
    engine = calibration.engine
    if engine.get("usable_blocks") is not None:  # a server's: its pool and block size, the workload's model
        pool = {"num_blocks": engine["usable_blocks"], "block_size": engine["block_size"], "kv_cache_memory": None}
        workload = workload.model_copy(update={"engine": workload.engine.model_copy(update=pool)})
    else:
        calibrations.check_engine(calibration, workload)
    facts = simulated_facts(workload, str(engine["device"]), str(engine["attention_backend"]))
    model = calibration.model
    info = CostModelInfo(
        kind="calibrated",
        step_times="calibrated",
        description=f"step time fitted on {calibration.num_steps:,} measured steps (R² {calibration.r2:.3f})",
        source=calibration.source,
        machine=calibration.machine,
        r2=calibration.r2,
        parameters={
            "intercept_s": model.intercept_s,
            "coefficients": model.coefficients,
            "gap_s": model.gap_s,
            "front_end_s": calibration.front_end_s,
            **({"step_jitter_s": list(calibration.jitter_s)} if calibration.jitter_s else {}),
        },
    )
    lag = calibration.front_end_s
    jitter = StepJitter(calibration.jitter_s) if calibration.jitter_s else None
    links = None
    if (facts.offload_host_blocks or facts.offload_disk_blocks) and facts.device == "cpu":  # the bundled engine's
        links = machine_tier_links(facts.bytes_per_block)
        info = info.model_copy(update={"description": f"{info.description}; {links.describe()}"})
    return SimSetup(facts, lambda: ModelClock(model, lag, links=links, jitter=jitter), info)


def engine_setup(workload: Workload, calibrate: Path | None = None) -> tuple[SimSetup, Calibrated | None]:
    """``calibrated_setup`` with the shipped calibration of the workload's engine, or one fitted on
    the run folder ``calibrate`` (returned too, with its fit and drift check, to show).

    Raises:
        KvplanError: no shipped calibration for the engine, a run folder that cannot calibrate, a
            calibration of another engine.
    """
    if calibrate is None:
        return _engine_setup(workload, calibrations.default_for(workload)), None
    calibrated = calibrations.from_run(calibrate)
    return _engine_setup(workload, calibrated.calibration), calibrated


def _engine_setup(workload: Workload, calibration: Calibration) -> SimSetup:
    """``calibrated_setup``, or for ``engine.disagg`` (kvplan.workload.admission.EngineDisagg) its two
    pools on kvplan.run.sim.disagg: each worker the calibrated engine with its pool's settings, each
    prompt's KV, ceil(prompt / block_size) blocks of ``bytes_per_block``, priced over ``link``. Its
    ``facts`` (fit checks) are the decode pool's with the smaller pool and max_model_len of the two
    and max_num_seqs x the decode workers (as gpu_target.disagg_setup's)."""
    disagg = workload.engine.disagg
    if disagg is None:
        return calibrated_setup(workload, calibration)
    from kvplan.run.sim.disagg import DisaggBackend
    from kvplan.sizing.gpus.links import lookup_link

    pre, dec = (_pool_setup(workload, role, calibration) for role in ("prefill", "decode"))
    link, x, y = lookup_link(disagg.link, "engine.disagg.link"), disagg.prefill.workers, disagg.decode.workers
    block, per_block = dec.facts.block_size, dec.facts.bytes_per_block

    def backend() -> DisaggBackend:
        pools = (pre.facts, pre.clock, x), (dec.facts, dec.clock, y)
        return DisaggBackend(*pools, link, lambda tokens: -(-tokens // block) * per_block)

    shape = f"{x}P + {y}D over {link.name}"
    limits = {
        "num_blocks": min(pre.facts.num_blocks, dec.facts.num_blocks),
        "max_model_len": min(pre.facts.max_model_len, dec.facts.max_model_len),
        "max_num_seqs": y * dec.facts.max_num_seqs,
    }
    info = dec.cost_model.model_copy(update={"description": f"{shape}; {dec.cost_model.description}"})
    return replace(dec, facts=dec.facts.model_copy(update=limits), cost_model=info, make_backend=backend, disagg=shape)


def _pool_setup(workload: Workload, role: str, calibration: Calibration) -> SimSetup:
    """``calibrated_setup`` of one ``engine.disagg`` pool's workers. A setting the pool gives itself
    that the setup refuses (a ``kv_cache_memory`` below one block) is named as the pool's
    (``engine.disagg.decode.kv_cache_memory``), not as the engine section's it replaced."""
    try:
        return calibrated_setup(workload.model_copy(update={"engine": workload.engine.pool(role)}), calibration)
    except KvplanError as err:
        own = getattr(workload.engine.disagg, role).model_dump(exclude_none=True)
        name = err.field.removeprefix("engine.")
        if err.field.startswith("engine.") and name in own:
            raise KvplanError(f"engine.disagg.{role}.{name}", err.problem, err.fix, source=err.source) from None
        raise


def replay_setup(workload: Workload, run_dir: Path) -> SimSetup:
    """The workload's engine, every step taking the measured run's own start and end
    (kvplan.run.sim.replay): the simulator's exactness check.

    Raises:
        KvplanError: a run folder that cannot be read, one that is not a measured run, or one
            whose records are missing or fewer than results.json counts.
    """
    from kvplan.results.run_result import RECORDS_FIX, check_records, load_run

    data = load_run(run_dir)
    if data.result.source != "measured" or data.result.engine is None:
        raise KvplanError("replay", f"{run_dir} is a {data.result.source} run", "replay a measured load test")
    check_records(data, RECORDS_FIX)  # without its steps or requests every level was left out, and the run said nothing
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
