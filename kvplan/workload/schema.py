"""The workload YAML: what to load-test, validated once at the edge.

A workload names one engine configuration, one prompt dataset, optional SLOs, a list of buckets
(request shape x load levels) and optional production targets (``plan:``) to size the same
buckets on. ``kvplan.workload.file.load_workload`` reads a file through this schema and turns
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
        # arrival: {process: gamma, burstiness: 0.5, ramp_up_s: 10}   # or constant (kvplan.workload.arrivals)
        num_requests: 32              # per level
    plan: [{model: llama-3.1-8b, gpu: L4, tp: 1, kv_cache_dtype: fp8}]
    shared_prefix: {num_tokens: 256, num_prefixes: 2, fraction: 0.75, num_tenants: 2}
    target: {url: http://localhost:8000/v1}   # a running server instead (kvplan.workload.server)
    gate: {tolerances: {ttft_p99_ms: {rel: 2.0, abs: 50}}}   # kvplan gate (kvplan.results.gated)

Engine defaults are EngineConfig's own (engine/config.py), read from its fields, so the YAML and
the engine never disagree. The request shapes (``dataset:``, token-length ranges, ``buckets:``) are
kvplan.workload.buckets'. ``kvplan schema workload`` prints this schema as JSON Schema, every field
described.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any

from pydantic import ByteSize, Field, PrivateAttr, field_validator, model_validator

from engine.config import KV_CACHE_DTYPES, AttentionBackendName, DeviceName, DtypeName, EngineConfig
from kvplan.results.gated import GateSettings
from kvplan.results.metrics import Slo
from kvplan.results.stats.steady import LevelSchedule
from kvplan.sizing import dtypes
from kvplan.workload.admission import (
    ADMISSION_FIELD,
    DISAGG_FIELD,
    OFFLOAD_FIELD,
    AdmissionSettings,
    EngineDisagg,
    OffloadSettings,
)
from kvplan.workload.buckets import Bucket, Count, Dataset, Name, StrictModel, Variant
from kvplan.workload.deployment import Deployment, kv_cache_dtype_value
from kvplan.workload.server import TargetSettings

Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]  # numpy's SeedSequence and torch take these
MAX_LEVEL_S = 24 * 3600  # an open-loop level whose arrivals alone take longer is a typo, not a test
MAX_BYTES = 2**63 - 1  # torch sizes are int64
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*")
ENGINE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(EngineConfig)}
# the KV dtypes the bundled engine stores, in kvplan's names (plan entries may name any of dtypes.DTYPES)
ENGINE_KV_DTYPES = tuple(dtypes.canonical(name) for name in KV_CACHE_DTYPES if name != "auto")


class EngineSettings(StrictModel):
    """The engine under test; fields and defaults are ``engine.config.EngineConfig``'s.

    The KV pool is ``kv_cache_memory`` (bytes, with units: ``48MiB``, ``1.5GiB``, ``512MB``)
    or ``num_blocks``; neither means the engine's default (256 MiB). ``kv_cache_dtype``: auto
    (the dtype the engine runs the model in), bf16, fp16, fp32 or fp8 (torch's names too).
    """

    model: str = Field(
        ENGINE_DEFAULTS["model"],
        description="The model the bundled engine loads: ``SmolLM2-135M-Instruct`` (the bundled GGUF), a local"
        " Hugging Face folder of a Llama-family model or ``tiny-random-llama`` (random weights, for"
        " tests); a target run without ``target.tokenizer`` reads the tokenizer from it.",
    )
    dtype: DtypeName = Field(
        ENGINE_DEFAULTS["dtype"], description="The dtype of the weights and activations; ``auto`` = bfloat16."
    )
    device: DeviceName = Field(
        ENGINE_DEFAULTS["device"],
        description="Where the engine runs: ``auto`` = CUDA when torch sees a GPU, else the CPU.",
    )
    block_size: Count = Field(
        ENGINE_DEFAULTS["block_size"],
        description="Tokens per KV cache block, the unit of a request's block table and of prefix caching"
        " (only full blocks are shared), tokens.",
    )
    kv_cache_memory: ByteSize | None = Field(
        None,
        description="The KV cache pool's size, bytes, with units (``48MiB``, ``1.5GiB``, ``512MB``; a plain"
        " integer is bytes), filled with as many whole blocks as fit; null, with num_blocks"
        " null too, = the engine's default of 256 MiB.",
    )
    num_blocks: Count | None = Field(
        ENGINE_DEFAULTS["num_blocks"],
        description="The KV cache pool's size in blocks of ``block_size`` tokens, instead of"
        " ``kv_cache_memory`` (give one, not both); null = sized by kv_cache_memory.",
    )
    kv_cache_dtype: str = Field(
        ENGINE_DEFAULTS["kv_cache_dtype"],
        description="The dtype the KV cache stores: ``auto`` = the model's ``dtype``, ``bf16``, ``fp16``,"
        " ``fp32`` or ``fp8`` (float8 e4m3, K and V scales calibrated before the run, see"
        " ``fp8_quality``); torch's names such as ``bfloat16`` are read too.",
    )
    max_num_seqs: Count = Field(
        ENGINE_DEFAULTS["max_num_seqs"],
        description="The most requests the scheduler runs at once (prefilling and decoding together).",
    )
    max_num_batched_tokens: Count = Field(
        ENGINE_DEFAULTS["max_num_batched_tokens"],
        description="The token budget of one engine step, tokens, shared by decodes (1 each) and prefills; a"
        " prompt longer than what is left is prefilled in chunks over several steps (chunked prefill).",
    )
    max_model_len: Count | None = Field(
        ENGINE_DEFAULTS["max_model_len"],
        description="The longest prompt + max_tokens one request may ask for, tokens (longer ones are refused as"
        " KV OOM); null = the model's max_position_embeddings, capped at the pool's size in tokens.",
    )
    enable_prefix_caching: bool = Field(
        ENGINE_DEFAULTS["enable_prefix_caching"],
        description="Whether requests reuse the cached full KV blocks of a common prompt prefix (same cache salt)"
        " instead of prefilling them again; ``shared_prefix`` needs it on.",
    )
    attention_backend: AttentionBackendName = Field(
        ENGINE_DEFAULTS["attention_backend"],
        description="The attention kernels: ``auto`` = triton on CUDA and torch on the CPU (``triton`` on the CPU"
        " needs TRITON_INTERPRET=1 and is for tests only).",
    )
    admission: AdmissionSettings = ADMISSION_FIELD
    offload: OffloadSettings = OFFLOAD_FIELD
    disagg: EngineDisagg | None = DISAGG_FIELD

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str) -> str:
        """A preset name or a folder: one line of text (an error message names it as written)."""
        if not value.strip():
            raise ValueError("names no model (got an empty text); give tiny-random-llama, a preset or a folder")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ValueError(f"must be one line of text without control characters (got {value!r})")
        return value

    @field_validator("kv_cache_dtype", mode="before")
    @classmethod
    def _kv_dtype(cls, value: Any) -> Any:
        return kv_cache_dtype_value(value, ENGINE_KV_DTYPES)

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
        if self.disagg is not None:
            on = "admission" if self.admission.is_on else "offload" if self.offload.is_on else None
            on = on or ("kv_cache_dtype: fp8" if self.kv_cache_dtype == "fp8" else None)
            if on:
                raise ValueError(f"disagg: {on} is not supported with a disaggregated engine; drop one of them")
        return self

    def pool(self, role: str) -> EngineSettings:
        """The settings of each ``role`` (prefill | decode) worker of ``disagg``: this section's with the
        pool's put over them, ``disagg`` none (every pool setting was validated on its own)."""
        assert self.disagg is not None
        own = getattr(self.disagg, role).over(self.model_dump(exclude={"disagg"}))
        return EngineSettings.model_validate(own)

    @property
    def model_dtype(self) -> str:
        """The dtype the engine runs the model in: ``dtype``, auto being bfloat16 (engine/config.py)."""
        return "bfloat16" if self.dtype == "auto" else self.dtype

    @property
    def resolved_kv_cache_dtype(self) -> str:
        """The KV cache's dtype, canonical (kvplan.sizing.dtypes): ``kv_cache_dtype``, auto being the
        model's dtype. The one place a workload's engine KV dtype is resolved."""
        return dtypes.canonical(self.model_dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype)

    def to_engine_config(self, seed: int) -> EngineConfig:
        settings = self.model_dump(exclude={"kv_cache_memory", "admission", "offload", "disagg"})
        settings |= self.admission.model_dump()
        settings |= self.offload.engine_fields()
        return EngineConfig(**settings, kv_cache_memory_bytes=self.kv_cache_memory, seed=seed)


class SharedPrefix(StrictModel):
    """The workload's ``shared_prefix:``: a prefix of ``num_tokens`` tokens (a system prompt,
    few-shot examples, a document) in front of requests' own prompts (kvplan.traffic.prefixes).

    ``num_prefixes`` distinct prefixes (groups); ``fraction`` of each bucket's requests carry one
    (the rest have none); ``num_tenants`` tenants, each with its own cache salt, so a group's
    requests of different tenants never share blocks. For sharegpt a prefix is the first
    ``num_tokens`` tokens of a long real ShareGPT turn; for random and jsonl, random token ids.
    A bucket's ``input_tokens`` range the request's own prompt, after the prefix. Every load
    level then runs twice: with caching effective and with it defeated.
    """

    num_tokens: Annotated[int, Field(ge=1)] = Field(
        description="Each prefix's length, tokens; at least engine.block_size, since the prefix cache shares"
        " full blocks only."
    )
    num_prefixes: Annotated[int, Field(ge=1)] = Field(
        1, description="Distinct prefixes (groups); the requests that carry one take the groups in turn."
    )
    fraction: Annotated[float, Field(gt=0, le=1)] = Field(
        1.0,
        description="The fraction (0..1, above 0) of each bucket's requests that carry a prefix, picked by a"
        " seeded draw; the rest have none.",
    )
    num_tenants: Annotated[int, Field(ge=1)] = Field(
        1,
        description="Tenants the requests are dealt over, each with its own cache salt, so requests of"
        " different tenants never share prefix-cache blocks.",
    )


class Fp8QualitySettings(StrictModel):
    """The fp8 KV cache's scale calibration and quality check, used only when ``engine.kv_cache_dtype``
    is fp8 (see kvplan.run.bundled.fp8_quality).

    The KV scales are calibrated on the first ``num_calibration_prompts`` sampled requests before
    the run. After it, the quality check compares the fp8 engine with the same engine keeping KV in
    the model dtype on ``num_prompts`` ShareGPT prompts (random token ids for a model without a
    tokenizer): greedy agreement over ``num_tokens`` tokens and the KL over ``num_tokens``
    teacher-forced reply tokens. ``num_prompts: 0`` skips the check.
    """

    num_calibration_prompts: Count = Field(
        4,
        description="The sampled requests (the first ones, buckets in order) whose prompts calibrate the fp8"
        " K and V scales before the run.",
    )
    num_prompts: Annotated[int, Field(ge=0)] = Field(
        10,
        description="Prompts the quality check compares the fp8 engine with a model-dtype KV engine on"
        " (ShareGPT; random token ids without a tokenizer); 0 skips the check.",
    )
    num_tokens: Count = Field(
        32,
        description="Tokens compared per prompt, below engine.max_model_len: greedy agreement over as many"
        " generated tokens and the KL over as many teacher-forced reply tokens.",
    )


class Workload(StrictModel):
    """A whole load test: the engine, the prompts, the SLOs, the buckets and their load levels, and
    the production targets to size them on."""

    name: Name = Field(
        description="The workload's name (letters, digits and ``_.-``, at most 200 characters): run folders are"
        " <name>-<timestamp>/ and a gate baseline belongs to one name."
    )
    seed: Seed = Field(
        0,
        description="The seed of every draw (prompts, lengths, shared prefixes, Poisson arrivals, the engine's"
        " sampling), in [0, 2**32 - 1]: the same seed sends the same requests.",
    )
    engine: EngineSettings = Field(
        EngineSettings(),
        description="The bundled engine under test (defaults: engine/config.py's), also what kvplan simulate"
        " models; a target run without ``target.tokenizer`` takes the tokenizer from its ``model``.",
    )
    dataset: Dataset = Field(description="Where prompts come from: ``sharegpt``, ``random`` or ``{jsonl: PATH}``.")
    slo: Slo = Field(
        Slo(),
        description="Per-request latency limits in ms (TTFT, TPOT, E2E) that goodput and the SLO capacity"
        " answers count against; none by default.",
    )
    buckets: Annotated[list[Bucket], Field(min_length=1)] = Field(
        description="The request shapes, at least one, each run at its own load levels, bucket by bucket."
    )
    variants: list[Variant] = Field(
        [],
        description="Engine variants every level runs on, in turn, with the same requests (a bucket's own"
        " ``variants`` replace these), e.g. two step budgets: ``[{name: chunk-256, engine:"
        " {max_num_batched_tokens: 256}}, {name: whole-prefill, engine: {max_num_batched_tokens: 2048}}]``;"
        " [] = the engine as it is.",
    )
    plan: list[Deployment] = Field(
        [],
        description="Production targets (model, GPU, tp, KV dtype) to size the same buckets on with kvplan's"
        " estimate and simulation; [] = none.",
    )
    fp8_quality: Fp8QualitySettings = Field(
        Fp8QualitySettings(),
        description="The fp8 KV scale calibration and quality check, used only when engine.kv_cache_dtype is fp8.",
    )
    shared_prefix: SharedPrefix | None = Field(
        None,
        description="Prefixes shared by groups of requests (system prompts, documents), every level then run"
        " with prefix caching effective and defeated; null = none.",
    )
    gate: GateSettings = Field(
        GateSettings(),
        description="``kvplan gate``'s tolerances per metric (kvplan.results.gated), winning over the baseline file's.",
    )
    target: TargetSettings | None = Field(
        None,
        description="A running OpenAI-compatible server to load-test instead of the bundled engine"
        " (``--target URL`` sets its url); null = the bundled engine.",
    )
    _source: str = PrivateAttr(default="<memory>")
    _sha256: str = PrivateAttr(default="")
    _warnings: tuple[str, ...] = PrivateAttr(default=())

    @property
    def source(self) -> str:
        """The file the workload was read from (``<memory>`` when built in code)."""
        return self._source

    @property
    def level_plans(self) -> dict[str, LevelSchedule]:
        """Bucket name -> its steady-state LevelSchedule, for the buckets with a duration, a warm-up or
        a cool-down (what the run result keeps, so its summaries leave those requests out)."""
        plans = {b.name: b.level_plan for b in self.buckets}
        return {name: plan for name, plan in plans.items() if not plan.is_plain}

    @property
    def class_slos(self) -> dict[str, dict[str, Slo]]:
        """Bucket name -> mix class -> the class's SLO: the workload's ``slo`` with each limit the
        class gives put in its place; for the classes that give their own ``slo`` only (the others
        are judged by the workload's)."""
        return {
            b.name: {c.name: self.slo.model_copy(update=(c.slo or Slo()).model_dump(exclude_none=True)) for c in own}
            for b in self.buckets
            if (own := [c for c in b.mix or [] if c.slo is not None])
        }

    @property
    def sha256(self) -> str:
        """The SHA-256 of that file's bytes (empty when built in code)."""
        return self._sha256

    @property
    def warnings(self) -> tuple[str, ...]:
        """One line per deprecated spelling the file used (the CLI prints them)."""
        return self._warnings

    def resolve_model(self, model: str) -> str:
        """A plan entry's ``model``: a path relative to the workload file's folder when one exists
        there (or when it names a file: ``.json``/``.gguf``), else as given (a preset name, a
        Hugging Face id such as ``meta-llama/Llama-3.1-8B-Instruct``, an absolute path)."""
        if self.source == "<memory>" or not model.strip() or Path(model).is_absolute():
            return model  # an empty name is refused as empty, not read as the workload's folder
        near = Path(self.source).parent / model
        looks_like_file = Path(model).suffix.lower() in (".json", ".gguf")
        return str(near) if near.exists() or looks_like_file else model

    @property
    def dataset_path(self) -> Path | None:
        """The jsonl or trace file, resolved against the workload file's folder."""
        if self.dataset.path is None:
            return None
        return (Path(self.source).parent / self.dataset.path).resolve()
