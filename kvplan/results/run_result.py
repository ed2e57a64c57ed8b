"""The run result: one typed, versioned value that every kind of run leaves and every view reads.

A measured load test, a simulated one and a run against a remote server all write the same
``RunResult`` as ``results.json``; ``kvplan report``, ``compare`` and ``gate`` read attributes
of it and never ask which kind it was (``source`` says so for people)::

    RunResult  schema_version 2, source, status, times
      workload   name, file, sha256, the validated config            (what was asked)
      run        versions, machine, dataset read                      (where it ran)
      engine     EngineFacts: pool, block size, KV dtype, model dims   (what served it; None for a target)
      server     ServerInfo: a remote target's URL, model, KV pool, metrics (None in-process)
      estimate   kvplan's prediction: bytes, pool, per-bucket max concurrency, plan targets
      slo        the SLO goodput counts against
      levels, buckets, kv, prefix_caching, fp8_quality   summaries of the records
      records    where the raw records are (requests.jsonl, steps.jsonl, server_metrics.jsonl)

``save_result`` writes it atomically; ``load_run`` reads a run folder and migrates older schema
versions (kvplan.results.migrate). ``kvplan schema results`` prints its JSON Schema.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field

from kvplan.errors import KvplanError, validation_error
from kvplan.results.metrics import LevelSummary, Slo
from kvplan.results.records import RequestRecord, StepRecord
from kvplan.results.simulated import CostModelInfo, TargetCapacity
from kvplan.results.stats.prefix_metrics import PrefixComparison
from kvplan.results.stats.server_samples import ServerSample
from kvplan.results.stats.steady import LevelSchedule
from kvplan.results.store import REQUESTS_FILE, STEPS_FILE, read_jsonl, write_atomic
from kvplan.results.target_facts import ClientLevel, ServerInfo  # noqa: F401  (re-exported: their old home)

SCHEMA_VERSION: Final = 2
RESULTS_FILE = "results.json"
Source = Literal["measured", "simulated", "target"]
Status = Literal["running", "complete", "interrupted"]


class _Part(BaseModel):
    # frozen; a field a newer kvplan adds is ignored when an older one reads the file
    model_config = ConfigDict(frozen=True, extra="ignore")


class WorkloadRef(_Part):
    """The workload as it was read: name, file, the file's sha256 and the validated config
    (``Workload.model_dump(mode="json")``, defaults filled in)."""

    name: str
    source: str = "<memory>"
    sha256: str = ""
    config: dict[str, Any] = {}


class RunInfo(_Part):
    """Where and with what it ran. ``dataset``: what the prompt source read (kind, conversations
    read, pairs kept, the shared prefixes' sources, ...)."""

    kvplan_version: str
    python: str
    platform: str
    torch: str | None = None
    transformers: str | None = None
    dataset: dict[str, Any] = {}


class KvScales(_Part):
    """An fp8 KV cache's calibrated per-layer scales (amax / 448), K then V, and what they came from."""

    num_calibration_prompts: int
    num_calibration_tokens: int
    k_scales: list[float]
    v_scales: list[float]


class EngineFacts(_Part):
    """What served the run, read once after it was built: the KV pool (``num_blocks`` blocks of
    ``block_size`` tokens, ``bytes_per_block`` bytes each across all layers, K and V), the KV
    dtype (kvplan's name: bf16, fp16, fp32, fp8), the scheduler limits and the model's dims.

    ``hf_config`` (the model's Hugging Face config, for kvplan's own estimate) exists only
    while the run goes on; it is not saved.
    """

    model: str
    device: str
    dtype: str
    kv_cache_dtype: str
    attention_backend: str
    block_size: int
    num_blocks: int
    bytes_per_block: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    seed: int
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    kv_scales: KvScales | None = None
    prefill_first: bool = Field(
        False,
        description="Steps with prefill to do compute prefills only, decodes waiting (engine.config's"
        " prefill_first; a simulated --backend sglang target, as SGLang schedules).",
    )
    offload_host_blocks: int = Field(
        0,
        description="KV offload tiers (engine.offload): the host-memory tier's capacity, blocks of"
        " bytes_per_block bytes (int(host_gib x 2**30) // bytes_per_block); 0 = no host tier.",
    )
    offload_disk_blocks: int = Field(0, description="The disk tier's capacity, blocks (as the host's); 0 = none.")
    hf_config: dict[str, Any] | None = Field(default=None, exclude=True, repr=False)

    # ignore[prop-decorator]: pydantic's documented idiom for computed fields; mypy does not
    # support decorators stacked on @property (pydantic's docs name this very ignore)
    @computed_field  # type: ignore[prop-decorator]
    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size

    @computed_field  # type: ignore[prop-decorator]
    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @computed_field  # type: ignore[prop-decorator]
    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size


class BucketEstimate(_Part):
    """kvplan's prediction for one bucket: its P95 request (prompt + output tokens), the blocks
    it takes, and how many such requests fit the pool at once (whole blocks, rounded down)."""

    name: str
    num_requests: int
    p95_request_tokens: int
    blocks_per_request: int
    max_concurrency: int
    simulated_knee: int | None = None  # the lowest concurrency the engine's scheduler preempts at (simulated)


class DeploymentBucket(_Part):
    name: str
    max_concurrency: int


class DeploymentEstimate(_Part):
    """The buckets sized on one production target (the workload's ``plan:``)."""

    model: str
    gpu: str
    tp: int
    kv_cache_dtype: str
    weight_dtype: str = "auto"  # as the plan entry gives it (auto: the checkpoint's own)
    bytes_per_token: int
    num_blocks: int | None
    kv_capacity_tokens: int | None
    buckets: list[DeploymentBucket] = []


class SharedPrefixEstimate(_Part):
    """The workload's shared prefix and what its full blocks weigh (bytes per request sharing it)."""

    num_tokens: int
    num_prefixes: int
    fraction: float
    num_tenants: int
    num_full_blocks: int
    shared_bytes_per_request: int


class RunEstimate(_Part):
    """kvplan's estimate for the engine that ran, made before the first request."""

    model: str
    kv_cache_dtype: str
    bytes_per_token: int
    bytes_per_block: int
    block_size: int
    num_blocks: int
    pool_tokens: int
    pool_bytes: int
    buckets: list[BucketEstimate] = []
    plan: list[DeploymentEstimate] = []
    shared_prefix: SharedPrefixEstimate | None = None


class BucketSummary(_Part):
    """Per bucket: kvplan's predicted max concurrency (P95 bound) and the simulated knee (the
    engine's scheduler replayed at every concurrency) against the measured knee (the lowest
    closed-loop level that preempted) and the highest clean level below it."""

    name: str
    p95_request_tokens: int | None = None
    predicted_max_concurrency: int | None = None
    simulated_knee: int | None = None
    measured_knee: int | None = None
    max_clean_concurrency: int | None = None
    levels_run: list[int | float] = []


class KvSummary(_Part):
    """Paging exactness: the largest |measured - paged estimate| over the steps where no block
    could be shared (all but a shared_prefix run's cached variant, ``num_shared_steps``)."""

    num_steps: int
    max_paged_error_bytes: int
    num_requests: int
    num_shared_steps: int | None = None


class Fp8QualityResult(_Part):
    """The fp8 KV quality check (definitions: kvplan.run.bundled.fp8_quality)."""

    model: str
    dtype: str
    prompts: str
    num_prompts: int
    num_tokens: int
    num_calibration_prompts: int
    prefix_agreement: float
    exact_match_rate: float
    mean_first_divergence: float
    num_kl_positions: int
    mean_kl: float
    max_kl: float
    top1_agreement: float
    seconds: float


class RecordFiles(_Part):
    """Where the raw records are, relative to the run folder (``server_metrics``: a target run's
    /metrics reads, kvplan.results.stats.server_samples)."""

    requests: str = REQUESTS_FILE
    steps: str = STEPS_FILE
    server_metrics: str | None = None


class RunResult(BaseModel):
    """One run's result (see the module docstring). Summaries are empty until ``summarized``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: Literal[2] = SCHEMA_VERSION
    source: Source = "measured"
    status: Status = "running"
    started_at: str
    finished_at: str | None = None
    report_written: bool = False
    workload: WorkloadRef
    run: RunInfo
    engine: EngineFacts | None = None
    server: ServerInfo | None = None
    estimate: RunEstimate | None = None
    slo: Slo = Slo()
    levels: list[LevelSummary] = []
    buckets: list[BucketSummary] = []
    kv: KvSummary | None = None
    prefix_caching: list[PrefixComparison] | None = None
    fp8_quality: Fp8QualityResult | None = None
    records: RecordFiles = RecordFiles()
    client: list[ClientLevel] = []  # a target run's client overhead per level
    stop_reason: str | None = None  # why a run stopped early other than Ctrl-C (a server that went away)
    cost_model: CostModelInfo | None = None  # a simulation's step timing (kvplan.results.simulated)
    capacity: list[TargetCapacity] = []  # a simulation's knee and SLO capacity answers, per target
    level_plans: dict[str, LevelSchedule] = {}  # bucket -> its steady-state levels (plain buckets absent)
    class_slos: dict[str, dict[str, Slo]] = Field({}, description="Bucket -> mix class -> its own SLO.")
    variant_engines: dict[str, EngineFacts] = Field({}, description="Engine variant -> the engine it ran on.")

    @property
    def summarized(self) -> bool:
        """Whether the summaries were computed (a run killed before its end has none yet)."""
        return self.kv is not None

    def planned_requests(self) -> dict[str, int]:
        """Bucket name -> the requests each of its levels was to run."""
        return {b.name: b.num_requests for b in (self.estimate.buckets if self.estimate else [])}


def save_result(run_dir: Path, result: RunResult) -> None:
    """Atomically (re)write ``run_dir/results.json``. Raises KvplanError when it cannot be written."""
    write_atomic(Path(run_dir) / RESULTS_FILE, result.model_dump_json(indent=2) + "\n")


@dataclass(frozen=True)
class RunData:
    """A run folder read back: its result and its raw records."""

    run_dir: Path
    result: RunResult
    requests: list[RequestRecord]
    steps: Sequence[StepRecord]  # a simulation's kept rows (kvplan.results.rows.StepRows), else a list
    server_samples: list[ServerSample] = field(default_factory=list)


def read_result(run_dir: str | Path) -> RunResult:
    """``run_dir/results.json`` as a RunResult, migrated from an older schema version.

    Raises:
        KvplanError: no folder or results.json, unreadable JSON, an unknown schema_version, or a
            field of the wrong type (one line naming it).
    """
    from kvplan.results.migrate import migrate

    run_dir = Path(run_dir)
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        raise KvplanError("", f"no {RESULTS_FILE} here", "pass a run folder written by kvplan", source=str(run_dir))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise KvplanError("", f"cannot read results ({err})", source=str(path)) from None
    if not isinstance(data, dict):
        kind = "null" if data is None else type(data).__name__
        raise KvplanError(
            "", f"must hold a JSON object (got {kind})", "pass a run folder written by kvplan", source=str(path)
        )
    try:
        return RunResult.model_validate(migrate(data, str(path)))
    except ValidationError as err:
        raise validation_error(err, str(path)) from None


def load_run(run_dir: str | Path) -> RunData:
    """A run folder: its result and its records (see :func:`read_result`, ``read_jsonl``)."""
    run_dir = Path(run_dir)
    result = read_result(run_dir)
    requests = read_jsonl(run_dir / result.records.requests, RequestRecord)
    steps = read_jsonl(run_dir / result.records.steps, StepRecord)
    server = result.records.server_metrics
    samples = read_jsonl(run_dir / server, ServerSample) if server else []
    return RunData(run_dir, result, requests, steps, samples)


RECORDS_FIX = "restore it from the run, or pass a run folder whose records are whole"


def check_records(data: RunData, fix: str | None = None) -> None:
    """Refuse records that cannot be the run's: a JSONL file missing, fewer or more records than
    the result counts (``kv.num_steps``, ``kv.num_requests``), or finished requests with no
    step in a run that records steps (not a target's, nor a disaggregated engine's: two pools). A
    view rebuilt from them would replace the measured one with an empty one.

    fix: what the error tells the user to do (default: kvplan report's).

    Raises:
        KvplanError: naming the file; nothing has been written.
    """
    fix = fix or "restore it from the run (kvplan report rebuilds every view from the records; nothing was written)"
    kv = data.result.kv
    for name, records, counted, what in (
        (data.result.records.steps, data.steps, kv and kv.num_steps, "steps"),
        (data.result.records.requests, data.requests, kv and kv.num_requests, "requests"),
    ):
        path = data.run_dir / name
        if not path.is_file():
            raise KvplanError("", "missing", fix, source=str(path))
        if counted is not None and counted != len(records):
            raise KvplanError("", f"holds {len(records)} {what}, results.json counts {counted}", fix, source=str(path))
    disagg = (data.result.workload.config.get("engine") or {}).get("disagg")
    if data.requests and not data.steps and data.result.source != "target" and not disagg:
        raise KvplanError(
            "",
            f"holds no steps, {data.result.records.requests} {len(data.requests)} finished requests",
            fix,
            source=str(data.run_dir / data.result.records.steps),
        )
