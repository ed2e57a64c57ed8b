"""The workload's request shapes: where prompts come from (``dataset:``), token-length ranges and
the buckets (``buckets:``) that run them at each load level.

Part of the workload schema (kvplan.workload.schema); the models here share its strict base, so a
string for an integer or an unknown key is an error, named with its YAML path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    Field,
    GetJsonSchemaHandler,
    WithJsonSchema,
    WrapValidator,
    model_validator,
)
from pydantic_core import core_schema

from kvplan.results.stats.steady import LevelSchedule
from kvplan.workload.arrivals import Arrival
from kvplan.workload.lengths import (  # noqa: F401  (re-exported: the workload schema's parts were all here)
    DISTRIBUTIONS,
    Count,
    Distribution,
    Lengths,
    Name,
    Span,
    StrictModel,
    _with_shorthands,
    span_seconds,
)
from kvplan.workload.protocol import VLLM_KINDS, BenchProtocol
from kvplan.workload.request_class import RequestClass, Variant
from kvplan.workload.sessions import Sessions

Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # requests/s
DatasetKind = Literal["sharegpt", "random", "jsonl", "trace"]
DATASETS: tuple[str, ...] = get_args(DatasetKind)


class Dataset(StrictModel):
    """Where prompts come from. Shorthands: ``dataset: sharegpt`` and ``dataset: {jsonl: PATH}``.

    ``path`` (jsonl and trace only) is relative to the workload file; each line holds ``prompt`` (text)
    or ``prompt_token_ids``, and optionally ``output_tokens``; a trace's lines are Mooncake-format
    requests (kvplan.workload.trace), replayed at their timestamps.
    """

    kind: DatasetKind = Field(
        description="The prompt source: ``sharegpt`` (the first human turn of real ShareGPT conversations, the"
        " reply's length in tokens as the output length), ``random`` (random token ids, lengths drawn"
        " from the buckets' ranges), ``jsonl`` (a file of prompts, see ``path``) or ``trace`` (a Mooncake-format"
        " trace replayed at its timestamps, kvplan.workload.trace)."
    )
    path: str | None = Field(
        None,
        description="The JSONL file, relative to the workload file (jsonl and trace only, where it is required):"
        " for jsonl one JSON object a line with ``prompt`` (text) or ``prompt_token_ids``, and optionally"
        " ``output_tokens``; for trace one request a line with ``timestamp`` (ms), ``input_length``,"
        " ``output_length`` and ``hash_ids`` (Mooncake's format).",
    )
    speed: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="Trace only: how much faster than recorded the trace is replayed (2.0 = twice as fast: line"
        " i arrives timestamp_i / 1000 / speed s into the level).",
    )
    max_requests: Count | None = Field(
        None, description="Trace only: replay the trace's first max_requests lines; null = all of them."
    )
    block_tokens: Count = Field(
        512,
        description="Trace only: tokens per hash id's block (Mooncake's traces: 512, AIPerf's --isl-block-size"
        " default).",
    )
    max_input_tokens: Count | None = Field(
        None,
        description="Trace only: clip each prompt to its first max_input_tokens tokens (leading shared blocks"
        " stay shared), tokens; null = the trace's input_length.",
    )
    max_output_tokens: Count | None = Field(
        None, description="Trace only: clip each max_tokens to this, tokens; null = the trace's output_length."
    )
    columns: dict[str, str] | None = Field(
        None,
        description="Trace only: the trace's columns by field, as ``kvplan profile --columns`` names them"
        " (``timestamp``, ``input_tokens``, ``output_tokens`` required; ``session``, ``latency``, ``finish``"
        " allowed, not replayed), for a CSV or JSONL of no known format (kvplan.workload.trace_formats);"
        " null = the format its header or first line names.",
    )
    time_unit: Literal["s", "ms", "us"] = Field(
        "s", description="Trace with ``columns`` only: the unit of a numeric ``timestamp`` (ISO text needs none)."
    )
    sessions: Sessions | None = Field(
        None,
        description="Multi-turn sessions (sharegpt and random only): each request of a bucket becomes a session of"
        " up to ``max_turns`` turns, turn k's prompt the history of turns 1..k-1 plus message k, sent"
        " ``think_time_s`` after turn k-1 finished; null = single requests.",
    )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        jsonl = {
            "type": "string",
            "description": "Shorthand for ``{kind: jsonl, path: PATH}``: the JSONL file of"
            " prompts, relative to the workload file.",
        }
        return _with_shorthands(
            handler,
            schema,
            {"enum": ["sharegpt", "random"]},
            {"type": "object", "properties": {"jsonl": jsonl}, "required": ["jsonl"], "additionalProperties": False},
        )

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
        if self.kind == "trace" and not self.path:
            raise ValueError("trace needs a path: dataset: {kind: trace, path: trace.jsonl}")
        if self.kind not in ("jsonl", "trace") and self.path is not None:
            raise ValueError(f"path applies to jsonl only (kind is {self.kind})")
        trace_keys = ("speed", "max_requests", "block_tokens", "max_input_tokens", "max_output_tokens", "columns")
        # by value, not by fields set: a stored run's config (every default written out) validates again
        given = [k for k in trace_keys if getattr(self, k) != type(self).model_fields[k].default]
        if self.kind != "trace" and given:
            raise ValueError(f"{given[0]} applies to trace only (kind is {self.kind})")
        if self.time_unit != "s" and self.columns is None:
            raise ValueError("time_unit applies to a trace read through columns only: give columns or drop it")
        return self


def _no_default(schema: dict[str, Any]) -> None:
    """A field's JSON schema without its ``default``: a sentinel no file should write."""
    schema.pop("default", None)


def _auto_or_levels(value: Any, handler: Any) -> Any:
    """``auto`` as it is; anything else validated as the list of levels it must be, so an error
    names the list or its item (a union would name both branches)."""
    return value if value == "auto" else handler(value)


# a list of concurrency levels, or "auto" (the levels around the simulated knee)
Concurrency = Annotated[
    list[Count],
    WrapValidator(_auto_or_levels),
    WithJsonSchema({"anyOf": [{"type": "array", "items": {"type": "integer", "minimum": 1}}, {"const": "auto"}]}),
]


class Bucket(StrictModel):
    """One request shape, run at each load level: closed-loop ``concurrency`` levels (N in
    flight) then open-loop ``request_rates`` (Poisson arrivals, requests/s), each with
    ``num_requests`` requests. ``concurrency: auto`` picks the levels around the bucket's knee as
    the engine's scheduler, simulated on the sampled requests, finds it (1 and knee - 2 .. knee + 1;
    kvplan.run.sim.search.levels_around), so a load test measures the knee at single-request
    resolution."""

    name: Name = Field(
        description="The bucket's name, unique in the workload (letters, digits and ``_.-``, at most 200"
        " characters), as reports and file names (latency_<name>.png) show it."
    )
    input_tokens: Lengths | None = Field(
        None,
        description="The prompt length range, tokens: ``128`` (fixed), ``[min, max]`` or a mapping with"
        " ``dist``; with ``shared_prefix`` it ranges the request's own prompt, after the prefix. Required"
        " unless the bucket has a ``mix`` (whose classes give their own).",
    )
    output_tokens: Lengths | None = Field(
        None,
        description="The output length range, tokens: each request's ``max_tokens``, generated in full with"
        " ignore_eos where the backend honours it (``128``, ``[min, max]`` or a mapping with ``dist``)."
        " Required unless the bucket has a ``mix``.",
    )
    mix: Annotated[list[RequestClass], Field(min_length=1)] | None = Field(
        None,
        description="Request classes run together in every level of the bucket (kvplan.traffic.mix), instead of"
        " the bucket's own ``input_tokens``/``output_tokens``: each request is drawn from a class by"
        " weight, and the report gives every class its own latency percentiles, SLO attainment and"
        " goodput; null = one shape.",
    )
    variants: list[Variant] | None = Field(
        None,
        description="Engine variants every level of this bucket runs on, in turn, with the same requests"
        " (kvplan.workload.variants); null = the workload's ``variants``.",
    )
    interference: bool = Field(
        False,
        description="For a ``mix``: also run each class alone at its share of each level's load (concurrency"
        " x share, rounded, at least 1; rate x share), so the report sets every class's P99 TTFT and"
        " TPOT mixed against alone. ``kvplan simulate`` always does.",
    )
    concurrency: Concurrency = Field(
        [],
        description="Closed-loop levels, run in ascending order, each keeping N requests in flight (N <="
        " num_requests), or ``auto``: 1 and knee - 2 .. knee + 1 around the knee (lowest"
        " concurrency that preempts) the simulated scheduler finds; [] = none.",
    )
    request_rates: list[Rate] = Field(
        [],
        description="Open-loop levels in req/s, run after the closed-loop ones, each sending its requests at"
        " Poisson arrivals (exponential gaps of mean 1/rate s; or see ``arrival``) however fast they"
        " finish; [] = none.",
    )
    arrival: Arrival = Field(
        Arrival(),
        description="How the open-loop levels' requests arrive (kvplan.workload.arrivals): ``process`` poisson"
        " (default), gamma (with ``burstiness``) or constant, and ``ramp_up_s``; closed-loop levels"
        " ignore it.",
    )
    # required but for a trace bucket (kvplan.workload.file checks it: 0 = not given, never validated),
    # whose count is the trace's line count, filled in when the workload is read (kvplan.workload.trace)
    num_requests: Count = Field(
        0,
        description="Requests per load level: the bucket's sampled requests, deterministic for the seed, the"
        " same list replayed at every level (with ``duration_s``, warm-up or cool-down requests, the"
        " list is cycled). Required, except over a ``trace`` dataset (then the trace's line count).",
        json_schema_extra=_no_default,
    )
    duration_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Run each level for this long, s, instead of for num_requests requests: closed-loop levels"
        " keep N in flight and open-loop levels keep sending, cycling the bucket's requests, until it"
        " ends; then the requests in flight finish. null = a level of num_requests requests.",
    )
    warmup: Span = Field(
        0,
        description="Kept out of every statistic at each level's start: a number of requests (sent before the"
        " num_requests measured ones) or a time (``30s``: requests that arrive in the level's first"
        " 30 s). 0 = none.",
    )
    cooldown: Span = Field(
        0,
        description="Kept out of every statistic at each level's end, so the measured requests run under full"
        " load: a number of requests (sent after the measured ones) or a time (``10s``: requests"
        " that arrive in the last 10 s of sending). 0 = none.",
    )
    protocol: BenchProtocol | None = Field(
        None,
        description="Run each level as a benchmark client would (kvplan.workload.protocol): ``kind``"
        " vllm_bench_serve or inferencex (``random_range_ratio``, ``num_prompts_per_concurrency``,"
        " ``warmup_per_concurrency``: that many requests per unit of concurrency after a drained warm-up),"
        " aiperf (``request_count``, ``warmup_request_count``, stddevs) or guidellm (``max_requests``,"
        " ``warmup``, ``cooldown``, stddevs, min/max). Lengths are drawn around ``input_tokens``/"
        "``output_tokens`` (one length each); num_requests follows. null = kvplan's own levels.",
    )

    @model_validator(mode="before")
    @classmethod
    def _protocol_count(cls, data: Any) -> Any:
        # a protocol sets num_requests (checked after validation): a vLLM client's the largest level's
        # measured count, aiperf's and guidellm's their measured count, the same at every level
        protocol = data.get("protocol") if isinstance(data, dict) else None
        if isinstance(protocol, dict) and protocol.get("kind") in VLLM_KINDS and "num_requests" not in data:
            per, levels = data["protocol"].get("num_prompts_per_concurrency", 10), data.get("concurrency")
            if isinstance(per, int) and isinstance(levels, list) and levels and all(isinstance(c, int) for c in levels):
                data = {**data, "num_requests": max(per * max(levels), 1)}
        elif isinstance(protocol, dict) and "num_requests" not in data:
            try:  # the same at every level: read off the valid protocol (an invalid one is named by its own check)
                data = {**data, "num_requests": BenchProtocol.model_validate(protocol).num_requests([])}
            except ValueError:
                pass
        return data

    @property
    def classes(self) -> tuple[RequestClass, ...]:
        """The bucket's request classes: its ``mix``, or one class named "" with the bucket's own
        lengths (a bucket without ``input_tokens``/``output_tokens`` fails the workload's checks
        before anything reads this)."""
        if self.mix is not None:
            return tuple(self.mix)
        assert self.input_tokens is not None and self.output_tokens is not None
        own = RequestClass.model_construct(
            name="", weight=1.0, input_tokens=self.input_tokens, output_tokens=self.output_tokens, slo=None
        )
        return (own,)

    def class_field(self, index: int, side: str) -> str:
        """The YAML path, below ``buckets[i]``, of class ``index``'s ``side`` (input_tokens,
        output_tokens): ``mix[1].input_tokens``, or ``input_tokens`` for a bucket without a mix."""
        return f"mix[{index}].{side}" if self.mix is not None else side

    @model_validator(mode="after")
    def _some_level(self) -> Bucket:
        # at least one level: checked across sections (kvplan.workload.file), since a trace bucket needs none
        for field in ("concurrency", "request_rates"):
            values = getattr(self, field)
            if values != "auto" and len(set(values)) != len(values):
                raise ValueError(f"{field} has duplicate levels: {values}")
        self._check_protocol()
        warm, cool = span_seconds(self.warmup), span_seconds(self.cooldown)
        if self.duration_s is not None and (warm or 0) + (cool or 0) >= self.duration_s:
            what = "warmup" if (warm or 0) >= self.duration_s else "warmup + cooldown"
            raise ValueError(
                f"{what} ({self.warmup}, {self.cooldown}) leaves nothing to measure in a {self.duration_s:g} s"
                " level (duration_s); shorten them or lengthen duration_s"
            )
        labels = [f"{rate:g}" for rate in self.request_rates]  # how reports and cache salts name a level
        if len(set(labels)) != len(labels):
            same = next(label for label in labels if labels.count(label) > 1)
            raise ValueError(
                f"request_rates has levels that read alike as {same} req/s ({self.request_rates});"
                " make them differ within 6 significant digits"
            )
        return self

    def _check_protocol(self) -> None:
        protocol = self.protocol
        if protocol is None:
            return
        if self.mix is not None or self.input_tokens is None or self.output_tokens is None:
            raise ValueError("protocol needs input_tokens and output_tokens (one length each), not a mix")
        # the client draws each length around one L (its --random-input-len / --random-output-len):
        # the bucket's range becomes the drawn one, L is kept in the protocol (so a dumped config reads back)
        for side, key in (("input_tokens", "input_len"), ("output_tokens", "output_len")):
            given, nominal = getattr(self, side), getattr(protocol, key)
            if nominal is None:
                if given.min != given.max:
                    raise ValueError(f"protocol draws {side} around one length L: give {side} as L alone")
                nominal = given.max
                protocol = protocol.model_copy(update={key: nominal})
            drawn = protocol.lengths(nominal, side.removesuffix("_tokens"))
            if (given.min, given.max) not in ((nominal, nominal), (drawn.min, drawn.max)):
                raise ValueError(f"protocol draws {side} in [{drawn.min}, {drawn.max}]: give {side} as {nominal} alone")
            object.__setattr__(self, side, drawn)  # frozen: set once, while validating
        object.__setattr__(self, "protocol", protocol)
        if self.concurrency == "auto" or not self.concurrency or self.request_rates:
            raise ValueError("protocol runs closed-loop levels only: give concurrency levels and no request_rates")
        if self.duration_s is not None or self.warmup != 0 or self.cooldown != 0:
            raise ValueError("protocol sets each level's counts and warm-up: drop duration_s, warmup and cooldown")
        wanted = protocol.num_requests(list(self.concurrency))
        if protocol.kind not in VLLM_KINDS:
            protocol.check_counts(list(self.concurrency), self.num_requests)
            return
        if self.num_requests != wanted:
            raise ValueError(
                f"num_requests is {self.num_requests}, the protocol sends {wanted} at the largest level"
                " (num_prompts_per_concurrency x concurrency): drop num_requests"
            )

    @property
    def level_plan(self) -> LevelSchedule:
        """How each of this bucket's levels runs: its count or duration, warm-up and cool-down; a
        protocol's counts per unit of concurrency (``LevelSchedule.at``)."""
        if self.protocol is not None:
            return self.protocol.schedule()
        warm, cool = span_seconds(self.warmup), span_seconds(self.cooldown)
        return LevelSchedule(
            num_requests=self.num_requests,
            duration_s=self.duration_s,
            warmup_requests=0 if warm is not None else int(self.warmup),
            warmup_s=warm or 0.0,
            cooldown_requests=0 if cool is not None else int(self.cooldown),
            cooldown_s=cool or 0.0,
        )
