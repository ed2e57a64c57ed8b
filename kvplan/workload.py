"""The workload YAML: what to load-test, validated once at the edge.

A workload names one engine configuration, one prompt dataset, optional SLOs, a list of buckets
(request shape x load levels) and optional production targets (``plan:``) to size the same
buckets on. ``load_workload`` turns every problem into one ``KvplanError`` line that names the
file and the YAML path, e.g. ``workloads/chat.yaml: buckets[1].concurrency[0]: must be >= 1 (got 0)``.

Minimal example::

    name: chat
    seed: 0
    engine: {model: SmolLM2-135M-Instruct, block_size: 16, kv_cache_memory: 48MiB}
    dataset: sharegpt                 # sharegpt | random | {jsonl: prompts.jsonl}
    slo: {ttft_ms: 2000, tpot_ms: 200}
    buckets:
      - name: short
        input_tokens: [16, 256]       # [min, max]; or 128 (fixed); or {min, max, dist, mean, std}
        output_tokens: [16, 128]
        concurrency: [1, 8, 32]       # closed loop: keep N requests in flight
        request_rates: [2.0]          # open loop: Poisson arrivals, requests/s
        num_requests: 32              # per level
    plan: [{model: llama-3.1-8b, gpu: L4, tp: 1, kv_dtype: fp8}]
    shared_prefix: {num_tokens: 256, num_prefixes: 2, fraction: 0.75, num_tenants: 2}
    gate: {tolerances: {ttft_p99_ms: {rel: 2.0, abs: 50}}}   # kvplan gate (kvplan.gate_metrics)
"""

from __future__ import annotations

import hashlib
import math
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, PrivateAttr, ValidationError
from pydantic import field_validator, model_validator

from engine.config import ATTENTION_BACKENDS, DEFAULT_MODEL, DEVICES, DTYPES, KV_CACHE_DTYPES
from engine.config import TINY_RANDOM_MODEL, EngineConfig
from kvplan.errors import KvplanError
from kvplan.gate_metrics import GateSettings
from kvplan.shared_prefix import SharedPrefix, check_shared_prefix
from kvplan.yaml_input import describe_error, read_yaml

Count = Annotated[int, Field(ge=1)]
# Names become file and folder names (<name>-<timestamp>/, latency_<bucket>.png): 200 characters
# leave room for the suffixes under the usual 255-byte limit of a file name.
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=200)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]  # numpy's SeedSequence and torch take these
Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # requests/s
MAX_LEVEL_S = 24 * 3600  # an open-loop level whose arrivals alone take longer is a typo, not a test
MAX_BYTES = 2**63 - 1  # torch sizes are int64
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*")
DATASETS = ("sharegpt", "random", "jsonl")
DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")


class _Strict(BaseModel):
    # strict: YAML already gives real types, so "4" for an integer is a typo worth reporting.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class EngineSettings(_Strict):
    """The engine under test; fields mirror ``engine.config.EngineConfig``.

    The KV pool is ``kv_cache_memory`` (bytes, with units: ``48MiB``, ``1.5GiB``, ``512MB``)
    or ``num_blocks``; neither means the engine's default (256 MiB).
    """

    model: str = DEFAULT_MODEL
    dtype: Literal[DTYPES] = "auto"
    device: Literal[DEVICES] = "auto"
    block_size: Count = 16
    kv_cache_memory: ByteSize | None = None
    num_blocks: Count | None = None
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = "auto"
    max_num_seqs: Count = 64
    max_num_batched_tokens: Count = 2048
    max_model_len: Count | None = None
    enable_prefix_caching: bool = True
    attention_backend: Literal[ATTENTION_BACKENDS] = "auto"

    @field_validator("kv_cache_memory", mode="before")
    @classmethod
    def _plain_number(cls, value: Any) -> Any:
        """``1e3MiB`` -> ``1000MiB``: pydantic's ByteSize reads no exponent (it would call the
        ``e3`` an unknown unit); a number beyond float range is out of range, not a bad unit."""
        match = _SIZE.fullmatch(value) if isinstance(value, str) else None
        if match is None or "e" not in match[1].lower():
            return value
        if not math.isfinite(float(match[1])):
            raise ValueError(f"the number is out of range (got {value!r}); give a size such as 48MiB or 1.5GiB")
        try:
            return f"{Decimal(match[1]):f}{match[2]}"
        except InvalidOperation:  # the regex admits only decimal numbers; kept for safety
            return value

    @field_validator("kv_cache_memory")
    @classmethod
    def _positive_memory(cls, value: ByteSize | None) -> ByteSize | None:
        if value is not None and value <= 0:
            raise ValueError("must be > 0 bytes")
        if value is not None and value > MAX_BYTES:
            raise ValueError(f"is out of range: at most 2**63 - 1 bytes (8 EiB) (got {int(value):.3g} bytes)")
        return value

    @model_validator(mode="after")
    def _one_pool_size(self) -> EngineSettings:
        if self.kv_cache_memory is not None and self.num_blocks is not None:
            raise ValueError("give kv_cache_memory or num_blocks, not both")
        return self

    def to_engine_config(self, seed: int) -> EngineConfig:
        fields = self.model_dump(exclude={"kv_cache_memory"})
        return EngineConfig(**fields, kv_cache_memory_bytes=self.kv_cache_memory, seed=seed)


class Dataset(_Strict):
    """Where prompts come from. Shorthands: ``dataset: sharegpt`` and ``dataset: {jsonl: PATH}``.

    ``path`` (jsonl only) is relative to the workload file; each line holds ``prompt`` (text) or
    ``prompt_token_ids``, and optionally ``output_tokens``.
    """

    kind: Literal[DATASETS]
    path: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"kind": data}
        if isinstance(data, dict) and "jsonl" in data and not {"kind", "path"} & set(data):
            # other keys stay, so an unknown one is named as such
            return {**{k: v for k, v in data.items() if k != "jsonl"}, "kind": "jsonl", "path": data["jsonl"]}
        return data

    @model_validator(mode="after")
    def _path_for_jsonl(self) -> Dataset:
        if self.kind == "jsonl" and not self.path:
            raise ValueError("jsonl needs a path: dataset: {jsonl: prompts.jsonl}")
        if self.kind != "jsonl" and self.path is not None:
            raise ValueError(f"path applies to jsonl only (kind is {self.kind})")
        return self


class Lengths(_Strict):
    """A token-length range ``[min, max]`` (inclusive) and, for random prompts, its distribution.

    For sharegpt and jsonl the range filters the real lengths. For random: ``fixed`` (min == max),
    ``uniform`` (default), ``normal`` (mean, std) or ``lognormal`` (mean and std of the lengths
    themselves, in tokens), draws clipped to the range. Shorthands: ``128`` and ``[16, 256]``.
    """

    min: Count
    max: Count
    dist: Literal[DISTRIBUTIONS] = "uniform"
    mean: Annotated[float, Field(gt=0)] | None = None
    std: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, int) and not isinstance(data, bool):
            return {"min": data, "max": data, "dist": "fixed"}
        if isinstance(data, list):
            if len(data) != 2:
                raise ValueError("a range is [min, max], two integers")
            return {"min": data[0], "max": data[1]}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Lengths:
        if self.min > self.max:
            raise ValueError(f"min must be <= max (got min {self.min}, max {self.max})")
        if self.dist == "fixed" and self.min != self.max:
            raise ValueError("dist fixed needs min == max (or write the length alone: 128)")
        if self.dist in ("normal", "lognormal") and self.std is None:
            raise ValueError(f"dist {self.dist} needs std (tokens)")
        if self.mean is not None and not self.min <= self.mean <= self.max:
            raise ValueError(f"mean must lie in [min, max] (got {self.mean})")
        return self

    @property
    def center(self) -> float:
        return self.mean if self.mean is not None else (self.min + self.max) / 2


class Bucket(_Strict):
    """One request shape, run at each load level: closed-loop ``concurrency`` levels (N in
    flight) then open-loop ``request_rates`` (Poisson arrivals, requests/s), each with
    ``num_requests`` requests."""

    name: Name
    input_tokens: Lengths
    output_tokens: Lengths
    concurrency: list[Count] = []
    request_rates: list[Rate] = []
    num_requests: Count

    @model_validator(mode="after")
    def _some_level(self) -> Bucket:
        if not self.concurrency and not self.request_rates:
            raise ValueError("give concurrency levels and/or request_rates")
        for field in ("concurrency", "request_rates"):
            values = getattr(self, field)
            if len(set(values)) != len(values):
                raise ValueError(f"{field} has duplicate levels: {values}")
        labels = [f"{rate:g}" for rate in self.request_rates]  # how reports and cache salts name a level
        if len(set(labels)) != len(labels):
            same = next(label for label in labels if labels.count(label) > 1)
            raise ValueError(f"request_rates has levels that read alike as {same} req/s ({self.request_rates});"
                             " make them differ within 6 significant digits")
        return self

    @property
    def max_request_tokens(self) -> int:
        return self.input_tokens.max + self.output_tokens.max


class Slo(_Strict):
    """Service-level objectives in milliseconds; any subset. Goodput counts requests meeting all."""

    ttft_ms: Annotated[float, Field(gt=0)] | None = None
    tpot_ms: Annotated[float, Field(gt=0)] | None = None
    e2e_ms: Annotated[float, Field(gt=0)] | None = None


class PlanTarget(_Strict):
    """A production target to size the buckets on: a model preset, a GPU, tensor parallelism
    and a KV cache dtype (names as in ``kvplan estimate``)."""

    model: str
    gpu: str
    tp: Count = 1
    kv_dtype: str = "auto"


class Fp8QualitySettings(_Strict):
    """Used only when ``engine.kv_cache_dtype`` is fp8 (see kvplan.fp8_quality).

    The KV scales are calibrated on the first ``num_calibration_prompts`` sampled requests before
    the run. After it, the quality check compares the fp8 engine with the same engine keeping KV in
    the model dtype on ``num_prompts`` ShareGPT prompts (random token ids for a model without a
    tokenizer): greedy agreement over ``num_tokens`` tokens and the KL over ``num_tokens``
    teacher-forced reply tokens. ``num_prompts: 0`` skips the check.
    """

    num_calibration_prompts: Count = 4
    num_prompts: Annotated[int, Field(ge=0)] = 10
    num_tokens: Count = 32


class Workload(_Strict):
    """A whole load test. ``source`` and ``sha256`` describe the file it was read from."""

    name: Name
    seed: Seed = 0
    engine: EngineSettings = EngineSettings()
    dataset: Dataset
    slo: Slo = Slo()
    buckets: Annotated[list[Bucket], Field(min_length=1)]
    plan: list[PlanTarget] = []
    fp8_quality: Fp8QualitySettings = Fp8QualitySettings()
    shared_prefix: SharedPrefix | None = None
    gate: GateSettings = GateSettings()  # kvplan gate's tolerances per metric (kvplan.gate_metrics)
    _source: str = PrivateAttr(default="<memory>")
    _sha256: str = PrivateAttr(default="")

    @property
    def source(self) -> str:
        return self._source

    @property
    def sha256(self) -> str:
        return self._sha256

    @property
    def dataset_path(self) -> Path | None:
        """The jsonl file, resolved against the workload file's folder."""
        if self.dataset.path is None:
            return None
        return (Path(self.source).parent / self.dataset.path).resolve()


def _check_semantics(workload: Workload) -> None:
    """Cross-section rules pydantic cannot place on a single field."""
    path = workload.dataset_path
    if path is not None and path.is_dir():
        raise KvplanError(f"{workload.source}: dataset.path", f"is a folder, not a JSONL file: {path}",
                          "give the path of the .jsonl file")
    if path is not None and not path.is_file():
        raise KvplanError(f"{workload.source}: dataset.path", f"file not found: {path}")
    if workload.dataset.kind == "sharegpt" and workload.engine.model == TINY_RANDOM_MODEL:
        raise KvplanError(
            f"{workload.source}: dataset",
            f"sharegpt needs a tokenizer and {TINY_RANDOM_MODEL} has none",
            "use dataset: random with this model",
        )
    names = [b.name for b in workload.buckets]
    for i, bucket in enumerate(workload.buckets):
        if bucket.name in names[:i]:
            raise KvplanError(f"{workload.source}: buckets[{i}].name", f"duplicate name {bucket.name!r}")
        for side in ("input_tokens", "output_tokens"):
            lengths: Lengths = getattr(bucket, side)
            if workload.dataset.kind != "random" and lengths.dist in ("normal", "lognormal"):
                raise KvplanError(
                    f"{workload.source}: buckets[{i}].{side}.dist",
                    f"applies to dataset random only (dataset is {workload.dataset.kind})",
                    "drop dist; the range filters the real lengths",
                )
        max_len = workload.engine.max_model_len
        if max_len is not None and bucket.input_tokens.min + bucket.output_tokens.min > max_len:
            raise KvplanError(
                f"{workload.source}: buckets[{i}]",
                f"shortest request ({bucket.input_tokens.min} + {bucket.output_tokens.min} tokens)"
                f" exceeds engine.max_model_len {max_len}",
            )
        for j, level in enumerate(bucket.concurrency):
            if level > bucket.num_requests:
                raise KvplanError(
                    f"{workload.source}: buckets[{i}].concurrency[{j}]",
                    f"{level} in flight needs at least {level} requests, the bucket has num_requests"
                    f" {bucket.num_requests} (its measured knee would claim a level never reached)",
                    f"raise num_requests to >= {level} or drop the level",
                )
        for j, rate in enumerate(bucket.request_rates):
            if bucket.num_requests / rate > MAX_LEVEL_S:
                raise KvplanError(
                    f"{workload.source}: buckets[{i}].request_rates[{j}]",
                    f"{bucket.num_requests} requests at {rate:g} req/s take about"
                    f" {bucket.num_requests / rate:.3g} s to arrive (num_requests / rate), over the"
                    f" {MAX_LEVEL_S // 3600} h a level may last",
                    f"give a rate >= {bucket.num_requests / MAX_LEVEL_S:.3g} req/s",
                )
    check_shared_prefix(workload)


def parse_workload(data: Any, source: str = "<memory>", sha256: str = "") -> Workload:
    """Validate an already-parsed YAML document. Raises KvplanError naming ``source`` and the field."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise KvplanError(source, f"must be a YAML mapping (got {kind})", "see workloads/smoke.yaml")
    try:
        workload = Workload.model_validate(data)
    except ValidationError as err:
        where, problem = describe_error(err)
        raise KvplanError(f"{source}: {where}" if where else source, problem) from None
    workload._source, workload._sha256 = source, sha256
    _check_semantics(workload)
    return workload


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload YAML file.

    Raises:
        KvplanError: unreadable file, malformed YAML, or any invalid field (one line, exit 2).
    """
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise KvplanError(source, f"cannot read workload file ({err.strerror or err})") from None
    return parse_workload(read_yaml(raw, source), source, hashlib.sha256(raw).hexdigest())
