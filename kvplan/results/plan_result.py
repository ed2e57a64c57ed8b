"""What ``kvplan plan`` finds, as saved in a plan's run folder (plan.json) and printed by ``--json``.

ConfigResult is one configuration's answer, PlanRun the whole search; both are contracts (keys
added, never renamed). ``schema_version`` counts changes a reader must know about; ``kvplan
schema plan`` prints the JSON Schema.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvplan.errors import KvplanError, describe_error

PLAN_FILE = "plan.json"
PLAN_SCHEMA_VERSION = 1


class ConfigResult(BaseModel):
    """One configuration's answer (the keys of ``kvplan plan --json``'s ``configs``; a contract)."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    tp: int
    num_gpus_per_replica: int
    replicas: int | None
    num_gpus: int | None
    kv_cache_dtype: str
    weight_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    feasible: bool
    reason: str
    slo_max_request_rate: float | None
    slo_max_concurrency: int | None
    step_times: str
    cost_source: str | None
    usd_per_hour: float | None
    usd_per_m_output_tokens: float | None
    usd_per_k_good_requests: float | None
    meets_slo: bool
    # at the highest concurrency meeting the SLO, per replica: output tok/s per GPU and per user
    output_tokens_per_s_per_gpu: float | None = None
    output_tokens_per_s_per_user: float | None = None
    ttft_p99_ms: float | None = Field(
        None,
        description="P99 TTFT at the capacity point that sized the replicas (its rate with --rate, its users with"
        " --users), ms; null: no point meets the SLO (or a plan written before it existed).",
    )
    tpot_p99_ms: float | None = Field(None, description="P99 TPOT at the same capacity point, ms; null as ttft_p99_ms.")
    disagg: str | None = Field(
        None,
        description="A disaggregated unit's shape (kvplan plan --disagg), e.g. '1P tp2 + 3D tp4 over rdma-400g': x"
        " prefill workers of tp t_p, y decode workers (the decode pool's tp, max_num_seqs and"
        " max_num_batched_tokens are this row's tp, max_num_seqs, max_num_batched_tokens); null: a replica.",
    )
    prefill_workers: int | None = Field(None, description="A disaggregated unit's prefill workers; null: a replica.")
    prefill_tp: int | None = Field(None, description="Tensor parallelism of each prefill worker; null: a replica.")
    decode_workers: int | None = Field(None, description="A disaggregated unit's decode workers; null: a replica.")
    link: str | None = Field(
        None, description="The link the KV moves over (kvplan/sizing/data/links.yaml); null: a replica."
    )
    prefill_max_num_seqs: int | None = Field(None, description="Each prefill worker's max_num_seqs; null: a replica.")
    prefill_max_num_batched_tokens: int | None = Field(
        None, description="Each prefill worker's token budget per step; null: a replica."
    )
    host_offload_gib: float | None = Field(
        None,
        description="GiB of host memory per replica kept as a KV offload tier (kvplan plan --host-offload-gib; the"
        " engine section's engine.offload.host_gib); null: none (or a plan written before it existed).",
    )


class WindowResult(BaseModel):
    """One window of a trace sized apart (``kvplan plan --window``): the best configuration judged on
    the window's own requests at the window's own rate (kvplan.optimize.plan_windows)."""

    index: int = Field(description="0-based, in time order")
    start_s: float = Field(description="from the trace's first arrival, s")
    num_requests: int = Field(description="arrivals in the window")
    judged_requests: int = Field(description="of them, the ones the capacity search cycled (evenly spaced when capped)")
    rate: float = Field(description="arrivals / window length, req/s")
    slo_max_request_rate: float | None = Field(
        description="per replica, req/s; None: no rate meets the SLO (or no request)"
    )
    replicas: int | None = Field(description="needed within the SLO (at least 1); None: the window cannot meet it")
    meets_slo: bool = Field(description="whether the configuration meets the SLO on this window")


class WindowPlan(BaseModel):
    """A trace sized window by window: replicas per window, a static deployment sized for the busiest
    window against one that follows the windows (kvplan.optimize.plan_windows has the cost rules)."""

    window_s: float = Field(description="Window length, s.")
    scale_up_s: float = Field(description="Seconds a new replica takes to serve; a scale-up is paid this early.")
    gpu: str = Field(description="the configuration sized (the best at the busiest window)")
    tp: int = Field(description="Its tensor-parallel size.")
    windows: list[WindowResult] = Field(description="One row per window, in time order.")
    static_replicas: int | None = Field(description="the most any window needs; None: some window cannot meet the SLO")
    static_usd: float | None = Field(description="static_replicas all along; None: unpriced or unmet")
    following_usd: float | None = Field(description="each window's replicas, scale-ups paid scale_up_s early")
    usd_per_gpu_hour: float | None = Field(description="The GPU price used, $/GPU-hour; null: unpriced.")


class PlanRun(BaseModel):
    """One ``kvplan plan`` search. ``load``, ``slo``, ``configs`` (ranked, cheapest meeting the SLO
    first) and ``best`` (the first, when it meets the SLO; else null) are ``--json``'s contract."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = Field(
        PLAN_SCHEMA_VERSION,
        description="The plan.json format's version (1; a file written before versions were recorded reads as 1,"
        " and one newer than this kvplan reads is refused).",
    )
    load: dict[str, float | int]
    slo: dict
    configs: list[ConfigResult]
    best: ConfigResult | None
    model: str = ""
    workload: str = ""
    bucket: str = ""
    attainment: float = 0.95
    num_configs: int = 0  # in the grid; more than len(configs) when interrupted
    interrupted: bool = False
    created: str = ""
    windows: WindowPlan | None = Field(None, description="With --window: the trace sized window by window.")
    disagg_verdict: str | None = Field(
        None,
        description="With --disagg: whether disaggregation pays at this load and why (the best unit against the best"
        " replica: cost, GPUs added or saved, TTFT P99 at capacity; kvplan.optimize.plan_disagg.disagg_verdict).",
    )
    offload_verdict: str | None = Field(
        None,
        description="With --host-offload-gib above 0: whether a host KV tier pays at this load and why (the best"
        " configuration with a tier against the best without; kvplan.optimize.plan_offload.offload_verdict).",
    )


def is_plan_dir(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a ``kvplan plan`` run folder (it holds plan.json)."""
    return (run_dir / PLAN_FILE).is_file()


def read_plan(run_dir: Path) -> PlanRun:
    """The search saved in ``run_dir``.

    Raises:
        KvplanError: plan.json is missing, not JSON, not a plan (the field named), or of a newer
            schema version than this kvplan reads.
    """
    path = run_dir / PLAN_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        run = PlanRun.model_validate(data)
    except FileNotFoundError:
        raise KvplanError("run_dir", f"{path} is missing", "give a folder written by kvplan plan") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise KvplanError("", f"not JSON ({err})", "re-run kvplan plan", source=str(path)) from None
    except ValidationError as err:
        field, problem = describe_error(err)
        raise KvplanError(field, problem, "re-run kvplan plan", source=str(path)) from None
    if run.schema_version > PLAN_SCHEMA_VERSION:
        raise KvplanError(
            "schema_version",
            f"is {run.schema_version}, newer than this kvplan reads ({PLAN_SCHEMA_VERSION})",
            "upgrade kvplan to read it",
            source=str(path),
        )
    return run
