"""A load-test run on disk: raw records first, written as they happen; summaries written whole.

Run folder (``reports/<name>-<timestamp>/``)::

    results.json     metadata, estimate, summaries; schema_version; replaced atomically
    requests.jsonl   one RequestRecord per finished request, appended and flushed at once
    steps.jsonl      one StepRecord per engine step, appended and flushed at once
    requests.csv     the same requests as a table (scalars and derived latencies in ms)
    steps.csv        the same steps as a table
    workload.yaml    the workload file as it was read
    summary.md, *.png    views, rebuilt by ``kvplan report DIR``

A run killed mid-write leaves at most one torn last line per JSONL file; ``load_run`` drops it.
Summary files are written to a temporary file in the same folder, then ``os.replace``d, so a
reader never sees half a ``results.json``. ``load_run`` checks every record and the sections of
results.json the views read, so a damaged file is one line naming it (and the line), and
``check_records`` refuses records that are missing or fewer than results.json counts, so that
``kvplan report`` never replaces measured views with empty ones.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from kvplan import metrics
from kvplan.errors import KvplanError
from kvplan.workload import Slo
from kvplan.yaml_input import describe_error

SCHEMA_VERSION = 1
RESULTS_FILE, REQUESTS_FILE, STEPS_FILE = "results.json", "requests.jsonl", "steps.jsonl"


@dataclass(frozen=True)
class RequestRecord:
    """One finished request of one load level. Times are ``time.perf_counter()`` seconds.

    ``level`` is the concurrency (mode ``closed``) or the request rate in requests/s (``open``).
    ``token_times[i]`` is when output token i was produced. ``finish_reason`` is the engine's
    (stop, length, abort, oom, cannot_fit). Latencies derived from these are in kvplan.metrics.
    """

    request_id: str
    bucket: str
    mode: str
    level: int | float
    arrival_time: float
    first_scheduled_time: float | None
    finish_time: float
    token_times: tuple[float, ...]
    num_prompt_tokens: int
    num_output_tokens: int
    max_tokens: int
    finish_reason: str
    finish_detail: str = ""
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    variant: str = ""  # "cached" | "uncached" in a shared_prefix run (see kvplan.prefix_metrics)
    prefix_group: int | None = None  # the shared prefix it carried; None: none
    tenant: int | None = None
    cache_salt: str | None = None  # requests share prefix blocks only under the same salt


@dataclass(frozen=True)
class StepRecord:
    """One engine step (the engine's StepStats) with its level and the KV bytes side by side.

    ``kv_resident_tokens``: per request holding blocks after the step, its tokens with K/V;
    ``kv_resident_request_ids`` names those requests in the same order.
    ``ideal_bytes`` = sum(resident tokens) x bytes per token; ``paged_bytes`` = sum of whole
    blocks per request x bytes per block; ``contiguous_bytes`` = requests holding KV x
    max_model_len x bytes per token (kvplan's estimate, all three); ``measured_bytes`` = used
    blocks x the engine's real bytes per block.
    """

    step_index: int
    bucket: str
    mode: str
    level: int | float
    start_time: float
    end_time: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_used_blocks: int
    num_free_blocks: int
    num_total_blocks: int
    num_preemptions: int
    num_finished: int
    num_oom: int
    num_prefix_queried_tokens: int
    num_prefix_hit_tokens: int
    kv_resident_tokens: tuple[int, ...]
    ideal_bytes: int
    paged_bytes: int
    contiguous_bytes: int
    measured_bytes: int
    variant: str = ""  # the level's variant, as in RequestRecord
    kv_resident_request_ids: tuple[str, ...] = ()


def request_row(rec: RequestRecord) -> dict[str, Any]:
    """The requests.csv row: scalars plus derived latencies in ms (empty when undefined)."""
    row = {k: v for k, v in asdict(rec).items() if k != "token_times"}
    ms = lambda s: None if s is None else s * 1e3  # noqa: E731
    row.update(ttft_ms=ms(metrics.ttft_s(rec)), tpot_ms=ms(metrics.tpot_s(rec)), e2e_ms=ms(metrics.e2e_s(rec)))
    return row


def step_row(rec: StepRecord) -> dict[str, Any]:
    """The steps.csv row: resident tokens summed, KV usage added."""
    row = {k: v for k, v in asdict(rec).items() if k not in ("kv_resident_tokens", "kv_resident_request_ids")}
    row["num_kv_requests"] = len(rec.kv_resident_tokens)
    row["kv_resident_tokens"] = sum(rec.kv_resident_tokens)
    row["kv_cache_usage"] = metrics.kv_cache_usage(rec)
    return row


class RunWriter:
    """Appends records to the run folder's JSONL files, flushing each line as it is written."""

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self._requests = open(run_dir / REQUESTS_FILE, "a", encoding="utf-8")
        self._steps = open(run_dir / STEPS_FILE, "a", encoding="utf-8")

    @staticmethod
    def _append(handle, record) -> None:
        handle.write(json.dumps(asdict(record)) + "\n")
        handle.flush()

    def write_request(self, record: RequestRecord) -> None:
        self._append(self._requests, record)

    def write_step(self, record: StepRecord) -> None:
        self._append(self._steps, record)

    def close(self) -> None:
        self._requests.close()
        self._steps.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace`` (atomic on POSIX).
    The file gets the mode of any new file (0666 less the umask), as the JSONL and PNGs do;
    ``tempfile.mkstemp`` would leave it 0600.

    Raises:
        KvplanError: the file cannot be written (a folder in its place, a full disk), one line.
    """
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise KvplanError(str(path), f"cannot write it ({err.strerror or err})",
                          "make room, or remove what is in the way") from None


def write_results(run_dir: Path, results: dict[str, Any]) -> None:
    """Atomically (re)write results.json, stamping the schema version."""
    results = {"schema_version": SCHEMA_VERSION, **results}
    write_atomic(run_dir / RESULTS_FILE, json.dumps(results, indent=2, allow_nan=False) + "\n")


def write_tables(run_dir: Path, requests: list[RequestRecord], steps: list[StepRecord]) -> None:
    """Atomically write requests.csv and steps.csv (empty tables keep their header)."""
    import pandas as pd

    tables = [
        ("requests.csv", [request_row(r) for r in requests], [f.name for f in fields(RequestRecord)]),
        ("steps.csv", [step_row(s) for s in steps], [f.name for f in fields(StepRecord)]),
    ]
    for name, rows, columns in tables:
        frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)
        if rows:  # concurrency N stays an integer next to open-loop rates (one column would be float)
            frame["level"] = pd.Series([r["level"] for r in rows], dtype=object)
        write_atomic(run_dir / name, frame.to_csv(index=False))


def _read_jsonl(path: Path, adapter: TypeAdapter) -> list:
    """The records of one JSONL file, each checked against its dataclass (unknown keys ignored);
    [] when there is no file (``check_records`` says whether that is allowed)."""
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise KvplanError(str(path), f"cannot read the records ({err})") from None
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(adapter.validate_json(line, strict=True))
        except ValidationError as err:
            if err.errors()[0]["type"] == "json_invalid":
                if number == len(lines):  # torn last line of a killed run
                    break
                raise KvplanError(f"{path}: line {number}", "not valid JSON") from None
            if err.errors()[0]["type"] in ("dataclass_type", "dataclass_exact_type"):
                raise KvplanError(f"{path}: line {number}", "must be a JSON object (a record)") from None
            field, problem = describe_error(err)
            raise KvplanError(f"{path}: line {number}: {field}", problem) from None
    return records


class _ConfigSection(BaseModel):
    model_config = ConfigDict(extra="allow")
    slo: Slo | None = None
    buckets: list[dict[str, Any]] = []


class _WorkloadSection(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = "?"
    config: _ConfigSection = _ConfigSection()


class _ResultsShape(BaseModel):
    """The sections of results.json the views and the gate read, with the types they assume;
    other keys are left alone. Only checked: ``load_run`` returns the dict as it was."""

    model_config = ConfigDict(extra="allow")
    schema_version: int
    status: str = "running"
    workload: _WorkloadSection = _WorkloadSection()
    run: dict[str, Any] = {}
    estimate: dict[str, Any] = {}
    levels: list[metrics.LevelSummary] = []
    buckets: list[dict[str, Any]] = []
    kv: dict[str, Any] = {}


@dataclass(frozen=True)
class RunData:
    """A run folder read back: results.json as a dict, and the raw records."""

    run_dir: Path
    results: dict[str, Any]
    requests: list[RequestRecord]
    steps: list[StepRecord]


def load_run(run_dir: str | Path) -> RunData:
    """Read a run folder.

    Raises:
        KvplanError: no folder, no or unreadable results.json, or an unknown schema_version.
    """
    run_dir = Path(run_dir)
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        raise KvplanError(str(run_dir), f"no {RESULTS_FILE} here", "pass a folder written by kvplan loadtest")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise KvplanError(str(path), f"cannot read results ({err})") from None
    if not isinstance(results, dict):
        kind = "null" if results is None else type(results).__name__
        raise KvplanError(str(path), f"must hold a JSON object (got {kind})",
                          "pass a folder written by kvplan loadtest")
    version = results.get("schema_version")
    if version != SCHEMA_VERSION:
        raise KvplanError(f"{path}: schema_version", f"expected {SCHEMA_VERSION} (got {version!r})")
    try:
        _ResultsShape.model_validate(results)
    except ValidationError as err:
        field, problem = describe_error(err)
        raise KvplanError(f"{path}: {field}", problem) from None
    requests = _read_jsonl(run_dir / REQUESTS_FILE, _REQUEST_ADAPTER)
    steps = _read_jsonl(run_dir / STEPS_FILE, _STEP_ADAPTER)
    return RunData(run_dir, results, requests, steps)


def check_records(data: RunData) -> None:
    """Refuse records that cannot be the run's: a JSONL file missing, fewer or more records than
    results.json counts (``kv.num_steps``, ``kv.num_requests``), or finished requests with no
    step. A view rebuilt from them would replace the measured one with an empty one.

    Raises:
        KvplanError: naming the file; nothing has been written.
    """
    fix = "restore it from the run (kvplan report rebuilds every view from the records; nothing was written)"
    counted = data.results.get("kv") or {}
    for name, records, key, what in ((STEPS_FILE, data.steps, "num_steps", "steps"),
                                     (REQUESTS_FILE, data.requests, "num_requests", "requests")):
        path = data.run_dir / name
        if not path.is_file():
            raise KvplanError(str(path), "missing", fix)
        if key in counted and counted[key] != len(records):
            raise KvplanError(str(path), f"holds {len(records)} {what}, results.json counts {counted[key]}"
                              f" (kv.{key})", fix)
    if data.requests and not data.steps:
        raise KvplanError(str(data.run_dir / STEPS_FILE), f"holds no steps, requests.jsonl {len(data.requests)}"
                          " finished requests", fix)


_REQUEST_ADAPTER, _STEP_ADAPTER = TypeAdapter(RequestRecord), TypeAdapter(StepRecord)


def summarize_run(results: dict[str, Any], requests: list[RequestRecord], steps: list[StepRecord]) -> dict[str, Any]:
    """The summary sections of results.json, a pure function of the records and the saved
    estimate and workload: ``levels`` (one LevelSummary per bucket x level x variant),
    ``buckets`` (predicted max concurrency vs measured knee), ``kv`` (paging exactness over the
    steps where no block could be shared: all but a shared_prefix run's cached variant) and, for
    a shared_prefix run, ``prefix_caching`` (kvplan.prefix_metrics.compare_variants)."""
    from kvplan import prefix_metrics

    config = results.get("workload", {}).get("config", {})
    slo = Slo(**(config.get("slo") or {}))
    planned = {b.get("name"): b.get("num_requests") for b in config.get("buckets", [])}
    levels = metrics.summarize_levels(requests, steps, slo, planned)
    estimates = {b["name"]: b for b in results.get("estimate", {}).get("buckets", [])}
    names = list(dict.fromkeys([*estimates, *(s.bucket for s in levels)]))
    buckets = []
    for name in names:
        # The predicted max concurrency shares nothing, so the knee is the unshared variant's.
        own = [s for s in levels if s.bucket == name and s.variant != prefix_metrics.CACHED]
        buckets.append({
            "name": name,
            "p95_request_tokens": estimates.get(name, {}).get("p95_request_tokens"),
            "predicted_max_concurrency": estimates.get(name, {}).get("max_concurrency"),
            "measured_knee": metrics.measured_knee(own),
            "max_clean_concurrency": metrics.max_clean_concurrency(own),
            "levels_run": [s.level for s in own],
        })
    unshared = [s for s in steps if s.variant != prefix_metrics.CACHED]
    kv = {
        "num_steps": len(steps),
        "max_paged_error_bytes": max((abs(s.measured_bytes - s.paged_bytes) for s in unshared), default=0),
        "num_requests": len(requests),
    }
    out = {"levels": [s.to_dict() for s in levels], "buckets": buckets, "kv": kv}
    pricing = prefix_metrics.PrefixPricing.from_results(results)
    if pricing is not None:
        kv["num_shared_steps"] = len(steps) - len(unshared)  # the cached variant's
        per_step = prefix_metrics.step_estimates(steps, requests, pricing)
        out["prefix_caching"] = prefix_metrics.compare_variants(out["levels"], steps, per_step)
    return out

