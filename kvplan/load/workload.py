"""The workload YAML: what to load-test, validated once at the edge.

A workload names one engine configuration, one prompt dataset, optional SLOs, a list of buckets
(request shape x load levels) and optional production targets (``plan:``) to size the same
buckets on. ``kvplan.load.workload_file.load_workload`` reads a file through this schema and turns
every problem into one ``KvplanError`` line that names the file and the YAML path, e.g.
``workloads/chat.yaml: buckets[1].concurrency[0]: must be >= 1 (got 0)``.

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
    plan: [{model: llama-3.1-8b, gpu: L4, tp: 1, kv_cache_dtype: fp8}]
    shared_prefix: {num_tokens: 256, num_prefixes: 2, fraction: 0.75, num_tenants: 2}
    target: {url: http://localhost:8000/v1}   # a running server instead (kvplan.load.target_settings)
    gate: {tolerances: {ttft_p99_ms: {rel: 2.0, abs: 50}}}   # kvplan gate (kvplan.results.gated)

Engine defaults are EngineConfig's own (engine/config.py), read from its fields, so the YAML and
the engine never disagree. ``kvplan schema workload`` prints this schema as JSON Schema.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, GetJsonSchemaHandler, PrivateAttr, WithJsonSchema
from pydantic import WrapValidator, field_validator, model_validator
from pydantic_core import core_schema

from engine.config import ATTENTION_BACKENDS, DEVICES, DTYPES, KV_CACHE_DTYPES, EngineConfig
from kvplan.errors import KvplanError
from kvplan.load.target_settings import TargetSettings
from kvplan.plan import dtypes
from kvplan.results.gated import GateSettings
from kvplan.results.metrics import Slo

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
ENGINE_DEFAULTS = {f.name: f.default for f in fields(EngineConfig)}
# the KV dtypes the bundled engine stores, in kvplan's names (plan entries may name any of dtypes.DTYPES)
ENGINE_KV_DTYPES = tuple(dtypes.canonical(name) for name in KV_CACHE_DTYPES if name != "auto")


def _kv_cache_dtype(value: Any, allowed: tuple[str, ...]) -> Any:
    """kvplan's name for a KV dtype (bfloat16 -> bf16), as a pydantic validator: ValueError
    naming the choices for an unknown one."""
    if not isinstance(value, str):
        return value  # strict str validation reports it
    try:
        return dtypes.canonical(value, allowed=allowed)
    except KvplanError as err:
        raise ValueError(f"{err.problem}; {err.fix}") from None


class _Strict(BaseModel):
    # strict: YAML already gives real types, so "4" for an integer is a typo worth reporting.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _with_shorthands(handler: GetJsonSchemaHandler, schema: core_schema.CoreSchema, *shorthands: dict) -> dict:
    """The JSON Schema of a model that also accepts shorthand forms (``dataset: sharegpt``,
    ``input_tokens: [16, 256]``): anyOf the shorthands and the full mapping."""
    return {"anyOf": [*shorthands, handler(schema)]}


class EngineSettings(_Strict):
    """The engine under test; fields and defaults are ``engine.config.EngineConfig``'s.

    The KV pool is ``kv_cache_memory`` (bytes, with units: ``48MiB``, ``1.5GiB``, ``512MB``)
    or ``num_blocks``; neither means the engine's default (256 MiB). ``kv_cache_dtype``: auto
    (the dtype the engine runs the model in), bf16, fp16, fp32 or fp8 (torch's names too).
    """

    model: str = ENGINE_DEFAULTS["model"]
    dtype: Literal[DTYPES] = ENGINE_DEFAULTS["dtype"]
    device: Literal[DEVICES] = ENGINE_DEFAULTS["device"]
    block_size: Count = ENGINE_DEFAULTS["block_size"]
    kv_cache_memory: ByteSize | None = None
    num_blocks: Count | None = ENGINE_DEFAULTS["num_blocks"]
    kv_cache_dtype: str = ENGINE_DEFAULTS["kv_cache_dtype"]
    max_num_seqs: Count = ENGINE_DEFAULTS["max_num_seqs"]
    max_num_batched_tokens: Count = ENGINE_DEFAULTS["max_num_batched_tokens"]
    max_model_len: Count | None = ENGINE_DEFAULTS["max_model_len"]
    enable_prefix_caching: bool = ENGINE_DEFAULTS["enable_prefix_caching"]
    attention_backend: Literal[ATTENTION_BACKENDS] = ENGINE_DEFAULTS["attention_backend"]

    @field_validator("kv_cache_dtype", mode="before")
    @classmethod
    def _kv_dtype(cls, value: Any) -> Any:
        return _kv_cache_dtype(value, ENGINE_KV_DTYPES)

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
        settings = self.model_dump(exclude={"kv_cache_memory"})
        return EngineConfig(**settings, kv_cache_memory_bytes=self.kv_cache_memory, seed=seed)


class Dataset(_Strict):
    """Where prompts come from. Shorthands: ``dataset: sharegpt`` and ``dataset: {jsonl: PATH}``.

    ``path`` (jsonl only) is relative to the workload file; each line holds ``prompt`` (text) or
    ``prompt_token_ids``, and optionally ``output_tokens``.
    """

    kind: Literal[DATASETS]
    path: str | None = None

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        return _with_shorthands(handler, schema, {"enum": ["sharegpt", "random"]},
                                {"type": "object", "properties": {"jsonl": {"type": "string"}},
                                 "required": ["jsonl"], "additionalProperties": False})

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

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        count = {"type": "integer", "minimum": 1}
        return _with_shorthands(handler, schema, count,
                                {"type": "array", "items": count, "minItems": 2, "maxItems": 2})

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


def _auto_or_levels(value: Any, handler: Any) -> Any:
    """``auto`` as it is; anything else validated as the list of levels it must be, so an error
    names the list or its item (a union would name both branches)."""
    return value if value == "auto" else handler(value)


# a list of concurrency levels, or "auto" (the levels around the simulated knee)
Concurrency = Annotated[list[Count], WrapValidator(_auto_or_levels), WithJsonSchema(
    {"anyOf": [{"type": "array", "items": {"type": "integer", "minimum": 1}}, {"const": "auto"}]})]


class Bucket(_Strict):
    """One request shape, run at each load level: closed-loop ``concurrency`` levels (N in
    flight) then open-loop ``request_rates`` (Poisson arrivals, requests/s), each with
    ``num_requests`` requests. ``concurrency: auto`` picks the levels around the bucket's knee as
    the engine's scheduler, simulated on the sampled requests, finds it (1 and knee - 2 .. knee + 1;
    kvplan.load.sim.search.levels_around), so a load test measures the knee at single-request
    resolution."""

    name: Name
    input_tokens: Lengths
    output_tokens: Lengths
    concurrency: Concurrency = []
    request_rates: list[Rate] = []
    num_requests: Count

    @model_validator(mode="after")
    def _some_level(self) -> Bucket:
        if not self.concurrency and not self.request_rates:
            raise ValueError("give concurrency levels and/or request_rates")
        for field in ("concurrency", "request_rates"):
            values = getattr(self, field)
            if values != "auto" and len(set(values)) != len(values):
                raise ValueError(f"{field} has duplicate levels: {values}")
        labels = [f"{rate:g}" for rate in self.request_rates]  # how reports and cache salts name a level
        if len(set(labels)) != len(labels):
            same = next(label for label in labels if labels.count(label) > 1)
            raise ValueError(f"request_rates has levels that read alike as {same} req/s ({self.request_rates});"
                             " make them differ within 6 significant digits")
        return self


class PlanTarget(_Strict):
    """A production target to size the buckets on: a model preset, a GPU, tensor parallelism
    and a KV cache dtype (names as in ``kvplan estimate``; ``auto``: the checkpoint's serving
    dtype). ``kv_dtype`` is the deprecated name of ``kv_cache_dtype``."""

    model_config = ConfigDict(json_schema_extra=lambda schema, _: schema["properties"].update(kv_dtype={
        "type": "string", "deprecated": True, "description": "deprecated name of kv_cache_dtype"}))

    model: str
    gpu: str
    tp: Count = 1
    kv_cache_dtype: str = "auto"

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kv_dtype" in data:
            if "kv_cache_dtype" in data:
                raise ValueError("give kv_cache_dtype only (kv_dtype is its deprecated name)")
            data = {("kv_cache_dtype" if k == "kv_dtype" else k): v for k, v in data.items()}
        return data

    @field_validator("kv_cache_dtype", mode="before")
    @classmethod
    def _kv_dtype(cls, value: Any) -> Any:
        return _kv_cache_dtype(value, tuple(dtypes.DTYPES))


class SharedPrefix(_Strict):
    """The workload's ``shared_prefix:``: a prefix of ``num_tokens`` tokens (a system prompt,
    few-shot examples, a document) in front of requests' own prompts (kvplan.load.prefixes).

    ``num_prefixes`` distinct prefixes (groups); ``fraction`` of each bucket's requests carry one
    (the rest have none); ``num_tenants`` tenants, each with its own cache salt, so a group's
    requests of different tenants never share blocks. For sharegpt a prefix is the first
    ``num_tokens`` tokens of a long real ShareGPT turn; for random and jsonl, random token ids.
    A bucket's ``input_tokens`` range the request's own prompt, after the prefix. Every load
    level then runs twice: with caching effective and with it defeated.
    """

    num_tokens: Annotated[int, Field(ge=1)]
    num_prefixes: Annotated[int, Field(ge=1)] = 1
    fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    num_tenants: Annotated[int, Field(ge=1)] = 1


class Fp8QualitySettings(_Strict):
    """Used only when ``engine.kv_cache_dtype`` is fp8 (see kvplan.load.fp8_check).

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
    gate: GateSettings = GateSettings()  # kvplan gate's tolerances per metric (kvplan.results.gated)
    target: TargetSettings | None = None  # a remote server to load-test instead of the engine
    _source: str = PrivateAttr(default="<memory>")
    _sha256: str = PrivateAttr(default="")
    _warnings: tuple[str, ...] = PrivateAttr(default=())

    @property
    def source(self) -> str:
        return self._source

    @property
    def sha256(self) -> str:
        return self._sha256

    @property
    def warnings(self) -> tuple[str, ...]:
        """One line per deprecated spelling the file used (the CLI prints them)."""
        return self._warnings

    def resolve_model(self, model: str) -> str:
        """A plan entry's ``model``: a path relative to the workload file's folder when one exists
        there (or when it names a file: ``.json``/``.gguf`` or a path with a folder), else as
        given (a preset name, an absolute path)."""
        if self.source == "<memory>" or Path(model).is_absolute():
            return model
        near = Path(self.source).parent / model
        looks_like_path = "/" in model or Path(model).suffix.lower() in (".json", ".gguf")
        return str(near) if near.exists() or looks_like_path else model

    @property
    def dataset_path(self) -> Path | None:
        """The jsonl file, resolved against the workload file's folder."""
        if self.dataset.path is None:
            return None
        return (Path(self.source).parent / self.dataset.path).resolve()
