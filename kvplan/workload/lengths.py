"""The strict base of every workload model, token-length ranges (``input_tokens``,
``output_tokens``) and spans (``warmup``, ``cooldown``: requests or a time): the parts of the
workload schema (kvplan.workload.schema) every section shares.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, PlainValidator, WithJsonSchema, model_validator
from pydantic_core import core_schema

Count = Annotated[int, Field(ge=1)]
# Workers in one disaggregated pool. The simulator steps every worker's scheduler
# (kvplan.run.sim.disagg): kvplan simulate of smoke.yaml took 1.3 s at 1 + 1 workers, 3.5 s at
# 16 + 16, 16 s at 64 + 64 and never ended at 100,000 (2026-12-06, shared 2-core Xeon); more load
# is served by replicas of a unit (kvplan plan sizes them). A plan entry's pool: the measured
# disaggregated rows reach 40 (tests/kvplan/data/silicon_disagg.yaml, Qwen3-32B on B200: 40
# prefill workers). engine.disagg's: each worker is an LLMEngine with its own weights and KV pool
# in this one process.
MAX_POOL_WORKERS = 64
MAX_BUNDLED_WORKERS = 16


def check_pool_workers(value: int, bundled: bool = False) -> int:
    """A pool's ``workers`` at most :data:`MAX_POOL_WORKERS` (``bundled``: engine.disagg's, at
    most :data:`MAX_BUNDLED_WORKERS`), as a pydantic after-validator.

    Raises:
        ValueError: the count and the fix, one line.
    """
    if bundled and value > MAX_BUNDLED_WORKERS:
        raise ValueError(
            f"{value} workers is over the {MAX_BUNDLED_WORKERS} a pool of the bundled engine may hold (each"
            f" loads its own weights and KV pool in this process); use at most {MAX_BUNDLED_WORKERS}"
        )
    if value > MAX_POOL_WORKERS:
        raise ValueError(
            f"{value} workers is over the {MAX_POOL_WORKERS} a pool may hold (the simulator steps each one);"
            f" use at most {MAX_POOL_WORKERS} and serve more load with replicas of the unit"
        )
    return value


# A token length beyond any published context window (Llama 4 Scout's 10M is the longest) is a
# typo; bounded so that drawing lengths and random prompts never overflows numpy's int64.
MAX_TOKENS = 2**24
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
# Names become file and folder names (<name>-<timestamp>/, latency_<bucket>.png): 200 characters
# leave room for the suffixes under the usual 255-byte limit of a file name.
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=200)]
Distribution = Literal["fixed", "uniform", "normal", "lognormal"]
DISTRIBUTIONS: tuple[str, ...] = get_args(Distribution)


class StrictModel(BaseModel):
    """The base of every workload model."""

    # strict: YAML already gives real types, so "4" for an integer is a typo worth reporting.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _with_shorthands(handler: GetJsonSchemaHandler, schema: core_schema.CoreSchema, *shorthands: dict) -> dict:
    """The JSON Schema of a model that also accepts shorthand forms (``dataset: sharegpt``,
    ``input_tokens: [16, 256]``): anyOf the shorthands and the full mapping, described as the
    mapping's first line."""
    full = handler(schema)
    first_line = handler.resolve_ref_schema(full).get("description", "").split("\n")[0]
    return {"description": first_line, "anyOf": [*shorthands, full]} if first_line else {"anyOf": [*shorthands, full]}


class Lengths(StrictModel):
    """A token-length range ``[min, max]`` (inclusive) and, for random prompts, its distribution.

    For sharegpt and jsonl the range filters the real lengths. For random: ``fixed`` (min == max),
    ``uniform`` (default), ``normal`` (mean, std) or ``lognormal`` (mean and std of the lengths
    themselves, in tokens), draws clipped to the range. Shorthands: ``128`` and ``[16, 256]``.
    """

    min: Tokens = Field(description="The shortest length of the range, tokens (inclusive).")
    max: Tokens = Field(description="The longest length of the range, tokens (inclusive; >= min, == min for fixed).")
    dist: Distribution = Field(
        "uniform",
        description="How lengths are drawn in [min, max] where kvplan draws them (random prompts, and"
        " jsonl lines without ``output_tokens``): ``uniform``, ``fixed`` (min == max), or"
        " ``normal`` / ``lognormal`` (dataset random only: ``mean`` and ``std``, draws"
        " rounded and clipped to the range).",
    )
    mean: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="The mean of the normal or lognormal draws, tokens, within [min, max]; null = the"
        " midpoint (min + max) / 2.",
    )
    std: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="The standard deviation of the normal or lognormal draws (of the lengths themselves for"
        " lognormal too), tokens; those two need it.",
    )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        count = {"type": "integer", "minimum": 1}
        return _with_shorthands(handler, schema, count, {"type": "array", "items": count, "minItems": 2, "maxItems": 2})

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


def _span(value: Any) -> int | str:
    """A warm-up or cool-down: a whole number of requests (``8``) or a time (``"30s"``, ``"500ms"``)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("give a number of requests (8) or a time in s or ms (30s, 500ms)")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must be >= 0 requests (got {value})")
        return value
    if span_seconds(value) is None:
        raise ValueError(f"{value!r} is neither a number of requests nor a time like 30s or 500ms")
    return value


def span_seconds(value: int | str) -> float | None:
    """``"30s"`` -> 30.0, ``"500ms"`` -> 0.5; None for a count of requests or a malformed time."""
    if not isinstance(value, str):
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)\s*", value)
    if match is None:
        return None
    return float(match[1]) / (1000.0 if match[2] == "ms" else 1.0)


# requests (an integer >= 0) or a time ("30s", "500ms"); kept as written, read by span_seconds
Span = Annotated[
    int | str,
    PlainValidator(_span),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": r"^\s*(\d+(\.\d*)?|\.\d+)\s*(ms|s)\s*$"},
            ]
        }
    ),
]
