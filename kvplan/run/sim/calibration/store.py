"""Calibrations: a step-time model fitted on one engine's measured run, kept with what it is valid for.

A calibration holds the fitted ``LinearStepCost`` (kvplan.run.sim.calibration.fit), the engine it was
measured on (model, dtype, KV dtype, block size, device, attention backend: what sets a step's
cost; pool size and scheduler limits do not, so a calibration serves any of them), the machine,
and the compact per-step samples it was fitted from. ``--calibrate RUN_DIR`` makes one from a
load test's run folder; ``data/`` ships defaults for the bundled engine, found by engine, and
among those of one engine the one measured on a CPU like this one (``machine_rank``: the same CPU
family, and bf16 arithmetic in hardware or not, which moves a bf16 step's cost 10x)::

    data/<name>.json          the model, its fit, engine, machine, source run
    data/<name>.steps.csv.gz  level, work (5 counts), seconds, gap: one row per measured step
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.run.sim.calibration.drift import Drift, find_drift
from kvplan.run.sim.calibration.fit import FEATURES, Fit, LinearStepCost, StepSample, fit_samples, samples_of
from kvplan.run.sim.cost import StepWork
from kvplan.workload.schema import Workload

DATA_DIR = Path(__file__).parent / "data"
ENGINE_KEYS = ("model", "dtype", "kv_cache_dtype", "block_size", "device", "attention_backend")


@dataclass(frozen=True)
class Calibration:
    """A fitted step-time model and what it is valid for. ``engine``: ENGINE_KEYS -> the
    measured run's values; ``source``: the run it came from; ``machine``: where it ran;
    ``front_end_s``: a server's front-end latency (s; kvplan.run.sim.calibration.client_steps),
    0 for the bundled engine measured in process; ``jitter_s``: a server's step residuals, s, as
    101 percentiles (client_steps.step_jitter; empty for the bundled engine, whose in-process
    steps the model fits closely)."""

    name: str
    model: LinearStepCost
    engine: dict[str, object]
    machine: str
    source: str
    r2: float
    num_steps: int
    front_end_s: float = 0.0
    jitter_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class Calibrated:
    """A calibration fitted on a run folder, with its fit (R², held-out levels), the samples it was
    fitted on and the run's drift check (kvplan.run.sim.calibration.drift)."""

    calibration: Calibration
    fit: Fit
    samples: list[StepSample]
    drift: list[Drift]


def from_run(run_dir: str | Path) -> Calibrated:
    """Fit a calibration on a measured run folder's steps, or on a ``--target`` run's steps as
    its client saw them (``_from_server_run``).

    Raises:
        KvplanError: records missing or fewer than results.json counts (naming the file);
            ``calibrate``: not a run folder, a simulated run, a measured one whose steps
            predate the recorded work (no prefill sequences, context or attended tokens), or a
            target run whose server pool is unknown or whose steps are too few to fit.
    """
    from kvplan.results.run_result import RECORDS_FIX, check_records, load_run

    data = load_run(run_dir)
    check_records(data, RECORDS_FIX)  # a steps.jsonl missing or cut short: fitted on what is left, silently
    result = data.result
    if result.source == "target":
        return _from_server_run(run_dir, data)
    if result.source != "measured" or result.engine is None:
        raise KvplanError(
            "calibrate",
            f"{run_dir} is a {result.source} run; calibrate on a measured load test",
            "pass a folder written by `kvplan loadtest`",
        )
    steps = [s for s in data.steps if s.num_prefill_tokens + s.num_decode_tokens > 0]
    if not steps or not any(s.num_context_tokens for s in steps):
        raise KvplanError(
            "calibrate",
            f"the steps of {run_dir} do not record the work they ran (the run is older than the step-time fields)",
            "rerun the load test with this kvplan",
        )
    samples = samples_of(steps)
    try:
        fit = fit_samples(samples)
    except ValueError as err:
        raise KvplanError("calibrate", f"{run_dir}: {err}", "run a load test with more steps") from None
    engine = {key: getattr(result.engine, key) for key in ENGINE_KEYS}
    calibration = Calibration(
        Path(run_dir).name,
        fit.model,
        engine,
        result.run.platform,
        f"{run_dir} ({result.workload.name}, {result.started_at})",
        fit.r2,
        fit.num_steps,
    )
    return Calibrated(calibration, fit, samples, find_drift(steps))


def server_pool(kind: str | None, num_gpu_blocks: int) -> int:
    """The blocks of a server's reported pool that requests can hold: vLLM keeps one of its
    ``num_gpu_blocks`` as the null block (vllm/v1/core/block_pool.py, ``BlockPool.__init__``:
    ``self.null_block = self.free_block_queue.popleft()``, vLLM 0.32.0), so N - 1; others all N."""
    return num_gpu_blocks - 1 if kind == "vllm" else num_gpu_blocks


def _from_server_run(run_dir: str | Path, data) -> Calibrated:
    """A calibration of a remote server: steps read back from the client's token times
    (kvplan.run.sim.calibration.client_steps), the pool the server reported. Its ``engine`` names
    the server, its block size, ``num_gpu_blocks`` and ``usable_blocks`` (``server_pool``); the
    model, dtypes and scheduler limits are the workload's (its ``engine:`` section, set to the
    server's ``--max-num-seqs`` and ``--max-num-batched-tokens``)."""
    from kvplan.run.sim.calibration.client_steps import client_samples, front_end_seconds, step_jitter

    result = data.result
    server = result.server
    if server is None or not server.num_gpu_blocks or not server.block_size:
        raise KvplanError(
            "calibrate",
            f"{run_dir} is a target run whose server said nothing of its KV pool (no cache_config_info)",
            "calibrate on a run against a server that exports its pool (vLLM, SGLang)",
        )
    try:  # a client's steps: their mean is what its latencies see; fitted again once the front end is known
        samples = client_samples(data.requests)
        fit = fit_samples(samples, mean=True)
        lag = front_end_seconds(data.requests, fit.model, step_jitter(samples, fit.model))
        samples = client_samples(data.requests, lag)
        fit = fit_samples(samples, mean=True)
        jitter = step_jitter(samples, fit.model)
    except ValueError as err:
        raise KvplanError("calibrate", f"{run_dir}: {err}", "run a load test with more requests") from None
    engine: dict[str, object] = {key: None for key in ENGINE_KEYS}
    engine.update(
        block_size=server.block_size,
        device=f"{server.kind or 'remote'} server",
        attention_backend="server",
        server=server.kind,
        num_gpu_blocks=server.num_gpu_blocks,
        usable_blocks=server_pool(server.kind, server.num_gpu_blocks),
    )
    calibration = Calibration(
        Path(run_dir).name,
        fit.model,
        engine,
        result.run.platform,
        f"{run_dir} ({result.workload.name}, {result.started_at}; steps read from client token times)",
        fit.r2,
        fit.num_steps,
        lag,
        jitter,
    )
    return Calibrated(calibration, fit, samples, [])


def check_engine(calibration: Calibration, workload: Workload) -> None:
    """Refuse a calibration measured on another engine than ``workload``'s (see ENGINE_KEYS).

    Raises:
        KvplanError: ``engine.<field>`` of the workload file, naming both values.
    """
    settings = workload.engine
    dtype = settings.model_dtype
    wanted = {
        "model": settings.model,
        "dtype": dtype,
        "block_size": settings.block_size,
        "kv_cache_dtype": settings.resolved_kv_cache_dtype,
        "device": None if settings.device == "auto" else settings.device,
        "attention_backend": None if settings.attention_backend == "auto" else settings.attention_backend,
    }
    for key in ENGINE_KEYS:
        if wanted[key] is not None and wanted[key] != calibration.engine.get(key):
            raise KvplanError(
                f"engine.{key}",
                f"is {wanted[key]}, the calibration ({calibration.source}) ran {calibration.engine.get(key)}",
                "calibrate on a load test of this engine (`calibrate`), or simulate a GPU with `model` and `gpu`",
                source=workload.source,
            )


def this_cpu() -> tuple[str, bool]:
    """(this machine's CPU model name, whether it has avx512_bf16), from /proc/cpuinfo; ("", False)
    where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "", False
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    return name, "avx512_bf16" in text


def machine_rank(calibration: Calibration, cpu: tuple[str, bool]) -> tuple[int, int]:
    """How well ``calibration``'s machine (``CPU name, N cores[ with avx512_bf16], ...``) matches
    ``cpu`` (this_cpu()): (same CPU family, same bf16 support), each 1 or 0; higher is better."""
    name, bf16 = cpu
    family = calibration.machine.split(",")[0].strip()
    return int(bool(family) and family in name), int(("with avx512_bf16" in calibration.machine) == bf16)


def default_for(workload: Workload) -> Calibration:
    """The shipped calibration of the workload's engine: of several, the one whose machine is most
    like this one (``machine_rank``), else the first in name order (a machine suffix sorts last).

    Raises:
        KvplanError: none ships for that engine (names ``calibrate``).
    """
    names, misses, fitting = [], [], []
    for path in sorted(DATA_DIR.glob("*.json"), key=lambda p: (len(p.stem), p.stem)):
        calibration = load(path)
        engine = calibration.engine
        names.append(
            f"{engine['model']} {engine['dtype']} (KV {engine['kv_cache_dtype']}, block {engine['block_size']})"
        )
        try:
            check_engine(calibration, workload)
        except KvplanError as err:
            if engine["model"] == workload.engine.model:
                misses.append(f"{err.field} {err.problem.split(',')[0].removeprefix('is ')}")
            continue
        fitting.append(calibration)
    if fitting:
        cpu = this_cpu()
        return max(fitting, key=lambda c: machine_rank(c, cpu))  # max keeps the first of the best
    settings = workload.engine
    which = f"{settings.model} with {misses[0]}" if misses else f"{settings.model}, dtype {settings.dtype}"
    raise KvplanError(
        "calibrate",
        f"no calibration ships for {which} (shipped: {'; '.join(dict.fromkeys(names))})",
        "give a load test of this engine to calibrate on, or simulate a GPU with `model` and `gpu`",
    )


# ---- the shipped files --------------------------------------------------------------------------
def load(path: Path) -> Calibration:
    """A calibration file (``data/<name>.json``)."""
    data = json.loads(path.read_text())
    model = LinearStepCost(data["intercept_s"], data["coefficients"], data["gap_s"])
    return Calibration(
        data["name"],
        model,
        data["engine"],
        data["machine"],
        data["source"],
        data["r2"],
        data["num_steps"],
        data.get("front_end_s", 0.0),
        tuple(data.get("jitter_s", ())),
    )


def save(calibration: Calibration, samples: list[StepSample], folder: Path = DATA_DIR) -> Path:
    """Write ``<name>.json`` and its samples ``<name>.steps.csv.gz`` into ``folder``."""
    c = calibration
    path = folder / f"{c.name}.json"
    path.write_text(
        json.dumps(
            {
                "name": c.name,
                "engine": c.engine,
                "machine": c.machine,
                "source": c.source,
                "r2": c.r2,
                "num_steps": c.num_steps,
                "intercept_s": c.model.intercept_s,
                "coefficients": c.model.coefficients,
                "gap_s": c.model.gap_s,
                "front_end_s": c.front_end_s,
                **({"jitter_s": list(c.jitter_s)} if c.jitter_s else {}),
                "features": list(FEATURES),
                "steps_file": f"{c.name}.steps.csv.gz",
            },
            indent=2,
        )
        + "\n"
    )
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["level", *FEATURES, "seconds", "gap_s"])
    for s in samples:
        writer.writerow(
            [
                s.level,
                *(getattr(s.work, f) for f in FEATURES),
                f"{s.seconds:.7f}",
                "" if s.gap_s is None else f"{s.gap_s:.7f}",
            ]
        )
    with gzip.GzipFile(folder / f"{c.name}.steps.csv.gz", "wb", mtime=0) as handle:
        handle.write(text.getvalue().encode())
    return path


def load_samples(path: Path) -> list[StepSample]:
    """The per-step samples a shipped calibration (``data/<name>.json``) was fitted from."""
    name = json.loads(path.read_text())["steps_file"]
    with gzip.open(path.parent / name, "rt") as handle:
        rows = list(csv.DictReader(handle))
    return [
        StepSample(
            r["level"],
            StepWork(*(int(r[f]) for f in FEATURES)),
            float(r["seconds"]),
            float(r["gap_s"]) if r["gap_s"] else None,
        )
        for r in rows
    ]
