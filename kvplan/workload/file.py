"""A workload file read: YAML -> the schema (kvplan.workload.schema) -> the rules that span sections.

Every problem is one KvplanError naming the file and the YAML path it concerns, e.g.
``workloads/chat.yaml: buckets[1].concurrency[2]: 64 in flight needs at least 64 requests, ...``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine.config import TINY_RANDOM_MODEL
from kvplan.errors import KvplanError, describe_error, validation_error
from kvplan.workload.buckets import Bucket
from kvplan.workload.schema import MAX_LEVEL_S, Workload
from kvplan.workload.trace import check_trace, with_trace_counts
from kvplan.workload.variants import check_target_variants, check_variants
from kvplan.yaml_input import read_input_file, read_yaml

# A bucket's requests are sampled up front, each with its prompt's tokens, and replayed at every
# level: 10 million keeps that list in memory (a typo of extra zeros otherwise ends in a MemoryError).
MAX_REQUESTS = 10_000_000
_COUNT_KEY = {  # the key a protocol's count comes from (kvplan.workload.protocol)
    "vllm_bench_serve": "protocol.num_prompts_per_concurrency",
    "inferencex": "protocol.num_prompts_per_concurrency",
    "aiperf": "protocol.request_count",
    "guidellm": "protocol.max_requests",
}


def _deprecations(data: dict[str, Any]) -> tuple[str, ...]:
    plan = data.get("plan")
    return tuple(
        f"plan[{i}].kv_dtype: deprecated name; write kv_cache_dtype"
        for i, target in enumerate(plan if isinstance(plan, list) else [])
        if isinstance(target, dict) and "kv_dtype" in target
    ) + _empty_variants(data)


def _empty_variants(data: dict[str, Any]) -> tuple[str, ...]:
    """What an empty ``variants: []`` does, said: it names no variant, so the levels run once on the
    engine section as it is (a bucket's, without the workload's variants)."""
    notes = []
    if data.get("variants") == []:
        notes.append("variants: [] names no variant: every level runs once, on the engine section as it is")
    buckets = data.get("buckets")
    for i, bucket in enumerate(buckets if isinstance(buckets, list) else []):
        if isinstance(bucket, dict) and bucket.get("variants") == [] and data.get("variants"):
            notes.append(
                f"buckets[{i}].variants: [] runs this bucket on the engine section alone, without the"
                " workload's variants"
            )
    return tuple(notes)


def parse_workload(data: Any, source: str = "<memory>", sha256: str = "") -> Workload:
    """Validate an already-parsed YAML document. Raises KvplanError naming ``source`` and the field."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise KvplanError("", f"must be a YAML mapping (got {kind})", "see workloads/smoke.yaml", source=source)
    try:
        workload = Workload.model_validate(data)
    except ValidationError as err:
        raise validation_error(err, source) from None
    workload._source, workload._sha256, workload._warnings = source, sha256, _deprecations(data)
    check_workload(workload)
    return with_trace_counts(workload)  # a trace bucket's num_requests: the trace's line count


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload YAML file.

    Raises:
        KvplanError: unreadable file, malformed YAML, or any invalid field (one line, exit 2).
    """
    source = str(path)
    raw = read_input_file(path, source, "workload file")  # not a device, nor a 16 GB file read whole
    return parse_workload(read_yaml(raw, source), source, hashlib.sha256(raw).hexdigest())


def with_target(workload: Workload, url: str | None, model: str | None) -> tuple[Workload, str]:
    """The workload with ``--target URL`` / ``--model SPEC`` put into its ``target:`` section;
    returns it and how errors name the URL (``target``: the option; ``target.url``: the file).

    Raises:
        KvplanError: ``model`` without any target, or a URL that is not http(s).
    """
    if url is None and workload.target is None:
        raise KvplanError("model", "applies to a target run only", "add `target` (a server URL) or drop `model`")
    from kvplan.workload.server import TargetSettings

    config = workload.target.model_dump() if workload.target is not None else {}
    if url is not None:
        config["url"] = url
    if model is not None:
        config["estimate_model"] = model
    try:
        settings = TargetSettings.model_validate(config)
    except ValidationError as err:
        field, problem = describe_error(err)
        raise KvplanError(
            "target" if field == "url" and url is not None else f"target.{field}",
            problem,
            source=None if url is not None else workload.source,
        ) from None
    if settings.url is None:
        raise KvplanError(
            "target.url", "required field missing", "give the server's URL here or as `target`", source=workload.source
        )
    updated = workload.model_copy(update={"target": settings})
    updated._source, updated._sha256, updated._warnings = workload.source, workload.sha256, workload.warnings
    check_target_variants(updated)
    return updated, "target" if url is not None else "target.url"


def check_workload(workload: Workload) -> None:
    """Every cross-section rule (see the module docstring). Raises KvplanError."""
    _check_required(workload)
    _check_dataset(workload)
    check_trace(workload)
    check_sessions(workload)
    _check_buckets(workload)
    _check_shared_prefix(workload)
    check_variants(workload)
    if workload.engine.disagg is not None and (workload.variants or any(b.variants for b in workload.buckets)):
        raise _error(
            workload, "variants", "are not supported with engine.disagg", "run each variant as its own workload"
        )


def _error(workload: Workload, field: str, problem: str, fix: str | None = None) -> KvplanError:
    return KvplanError(field, problem, fix, source=workload.source)


def _check_dataset(workload: Workload) -> None:
    path = workload.dataset_path
    if path is not None and path.is_dir():
        raise _error(
            workload, "dataset.path", f"is a folder, not a JSONL file: {path}", "give the path of the .jsonl file"
        )
    if path is not None and path.exists() and not path.is_file():
        raise _error(
            workload,
            "dataset.path",
            f"is not a regular file (a device, pipe or socket): {path}",
            "give the path of a JSONL or CSV file",
        )
    if path is not None and not path.is_file():
        raise _error(workload, "dataset.path", f"file not found: {path}")
    has_tokenizer = workload.target is not None and workload.target.tokenizer is not None
    if workload.dataset.kind == "sharegpt" and workload.engine.model == TINY_RANDOM_MODEL and not has_tokenizer:
        raise _error(
            workload,
            "dataset",
            f"sharegpt needs a tokenizer and {TINY_RANDOM_MODEL} has none",
            "use dataset: random with this model",
        )


def _check_required(workload: Workload) -> None:
    """``num_requests`` and at least one level, which every bucket needs but a trace's (its count
    and its one level come from the trace, kvplan.workload.trace)."""
    if workload.dataset.kind == "trace":
        return
    for i, bucket in enumerate(workload.buckets):
        if "num_requests" not in bucket.model_fields_set:
            raise _error(workload, f"buckets[{i}].num_requests", "required field missing")
        if bucket.num_requests > MAX_REQUESTS:
            key = "num_requests" if bucket.protocol is None else _COUNT_KEY[bucket.protocol.kind]
            raise _error(
                workload,
                f"buckets[{i}].{key}",
                f"{bucket.num_requests:,} requests per level is over the {MAX_REQUESTS:,} kvplan samples",
                f"lower {key.split('.')[-1]}"
                + ("" if bucket.protocol else " (duration_s runs a level for a time, cycling its requests)"),
            )
        if not bucket.concurrency and not bucket.request_rates:
            raise _error(workload, f"buckets[{i}]", "give concurrency levels and/or request_rates")
        _check_sent(workload, i, bucket)


def _check_sent(workload: Workload, i: int, bucket: Bucket) -> None:
    """A level's warm-up + measured + cool-down requests (each simulated or sent) at most
    ``MAX_REQUESTS``: a warm-up of 10^11 requests runs for days rather than fail."""
    plan = bucket.level_plan
    levels = [*(bucket.concurrency if bucket.concurrency != "auto" else [1]), *bucket.request_rates]
    sent = max(plan.at(level).total_requests or 0 for level in levels)
    if sent <= MAX_REQUESTS:
        return
    top = plan.at(max(levels))
    if bucket.protocol is not None:
        per_c = bucket.protocol.kind in ("vllm_bench_serve", "inferencex")
        key = "protocol." + ("warmup_per_concurrency" if per_c else "warmup_request_count")
    else:
        key = "warmup" if top.warmup_requests >= top.cooldown_requests else "cooldown"
    raise _error(
        workload,
        f"buckets[{i}].{key}",
        f"a level sends {sent:,} requests (warm-up, measured and cool-down), over the {MAX_REQUESTS:,} kvplan runs",
        f"lower {key.split('.')[-1]}",
    )


def _check_buckets(workload: Workload) -> None:
    names = [b.name for b in workload.buckets]
    max_len = workload.engine.max_model_len
    for i, bucket in enumerate(workload.buckets):
        at = f"buckets[{i}]"
        if bucket.name in names[:i]:
            raise _error(workload, f"{at}.name", f"duplicate name {bucket.name!r}")
        if workload.dataset.kind == "trace":
            continue  # lengths, count and arrivals from the trace (kvplan.workload.trace.check_trace)
        _check_mix(workload, at, bucket)
        for c, shape in enumerate(bucket.classes):
            for side in ("input_tokens", "output_tokens"):
                if workload.dataset.kind != "random" and getattr(shape, side).dist in ("normal", "lognormal"):
                    raise _error(
                        workload,
                        f"{at}.{bucket.class_field(c, side)}.dist",
                        f"applies to dataset random only (dataset is {workload.dataset.kind})",
                        "drop dist; the range filters the real lengths",
                    )
            if max_len is not None and shape.input_tokens.min + shape.output_tokens.min > max_len:
                raise _error(
                    workload,
                    at if bucket.mix is None else f"{at}.mix[{c}]",
                    f"shortest request ({shape.input_tokens.min} + {shape.output_tokens.min}"
                    f" tokens) exceeds engine.max_model_len {max_len}",
                )
        plan = bucket.level_plan
        for j, level in enumerate(bucket.concurrency if bucket.concurrency != "auto" else []):
            sent = plan.at(level).total_requests  # None: a timed level, which cycles its requests
            if sent is not None and level > sent:
                raise _error(
                    workload,
                    f"{at}.concurrency[{j}]",
                    f"{level} in flight needs at least {level} requests, the bucket has num_requests"
                    f" {bucket.num_requests} (its measured knee would claim a level never reached)",
                    f"raise num_requests to >= {level} or drop the level",
                )
        if plan.duration_s is not None and plan.duration_s > MAX_LEVEL_S:
            raise _error(
                workload,
                f"{at}.duration_s",
                f"{plan.duration_s:g} s is over the {MAX_LEVEL_S // 3600} h a level may last",
                f"give at most {MAX_LEVEL_S} s",
            )
        sent = plan.total_requests  # None: a timed level, which cycles its requests
        for j, rate in enumerate(bucket.request_rates):
            if plan.duration_s is not None and rate * plan.duration_s < 1:
                raise _error(
                    workload,
                    f"{at}.request_rates[{j}]",
                    f"at {rate:g} req/s a {plan.duration_s:g} s level (duration_s) expects"
                    f" {rate * plan.duration_s:.2g} arrivals",
                    f"give a rate >= {1 / plan.duration_s:.3g} req/s or a longer duration_s",
                )
            if sent is not None and sent / rate > MAX_LEVEL_S:
                raise _error(
                    workload,
                    f"{at}.request_rates[{j}]",
                    f"{sent} requests at {rate:g} req/s take about"
                    f" {sent / rate:.3g} s to arrive (num_requests / rate), over the"
                    f" {MAX_LEVEL_S // 3600} h a level may last",
                    f"give a rate >= {sent / MAX_LEVEL_S:.3g} req/s",
                )


def _check_mix(workload: Workload, at: str, bucket: Bucket) -> None:
    """A bucket has its own lengths or a mix of classes, not both; a mix's class names are
    unique and its weights sum to a positive number; ``interference`` needs a mix."""
    if bucket.interference and bucket.mix is None:
        raise _error(
            workload,
            f"{at}.interference",
            "needs a mix: it runs each request class alone beside the mixed level",
            "add a mix of classes or drop interference",
        )
    for side in ("input_tokens", "output_tokens"):
        given = getattr(bucket, side) is not None
        if bucket.mix is None and not given:
            raise _error(workload, f"{at}.{side}", "required field missing", "give a range, or a mix of classes")
        if bucket.mix is not None and given:
            raise _error(
                workload,
                f"{at}.{side}",
                "a mix bucket takes its lengths from its classes",
                f"give {side} in each mix class",
            )
    if bucket.mix is None:
        return
    names = [c.name for c in bucket.mix]
    for c, name in enumerate(names):
        if name in names[:c]:
            raise _error(workload, f"{at}.mix[{c}].name", f"duplicate class name {name!r}")
    if sum(c.weight for c in bucket.mix) <= 0:
        raise _error(
            workload,
            f"{at}.mix",
            f"the weights must sum to a positive number (got {sum(c.weight for c in bucket.mix):g})",
            "give at least one class a weight > 0",
        )


def _check_shared_prefix(workload: Workload) -> None:
    """Prefix caching on, a prefix of at least one block (only full blocks are shared), and every
    bucket's shortest request with the prefix within engine.max_model_len."""
    prefix, engine = workload.shared_prefix, workload.engine
    if prefix is None:
        return
    if not engine.enable_prefix_caching:
        raise _error(
            workload,
            "engine.enable_prefix_caching",
            "shared_prefix needs prefix caching on (got false)",
            "set engine.enable_prefix_caching: true",
        )
    if prefix.num_tokens < engine.block_size:
        raise _error(
            workload,
            "shared_prefix.num_tokens",
            f"must be >= engine.block_size {engine.block_size}: only full blocks are shared (got {prefix.num_tokens})",
        )
    for i, bucket in enumerate(workload.buckets):
        for c, shape in enumerate(bucket.classes):
            shortest = prefix.num_tokens + shape.input_tokens.min + shape.output_tokens.min
            if engine.max_model_len is not None and shortest > engine.max_model_len:
                raise _error(
                    workload,
                    f"buckets[{i}]" if bucket.mix is None else f"buckets[{i}].mix[{c}]",
                    f"shortest request with the shared prefix ({prefix.num_tokens} + {shape.input_tokens.min}"
                    f" + {shape.output_tokens.min} = {shortest} tokens) exceeds engine.max_model_len"
                    f" {engine.max_model_len}",
                )


def check_sessions(workload: Workload) -> None:
    """The rules sessions set across sections (kvplan.workload.file runs them): a dataset of
    sharegpt or random, no shared prefix, and buckets that run each session once (no
    ``duration_s``, warm-up or cool-down) with one shape (no ``mix``).

    Raises:
        KvplanError: naming the field that cannot go with ``dataset.sessions``.
    """
    if workload.dataset.sessions is None:
        return
    where = workload.source
    if workload.dataset.kind == "jsonl":
        raise KvplanError(
            "dataset.sessions",
            "applies to dataset sharegpt and random only (dataset is jsonl)",
            "drop sessions, or use dataset sharegpt or random",
            source=where,
        )
    if workload.shared_prefix is not None:
        raise KvplanError(
            "shared_prefix", "is not supported with sessions (dataset.sessions)", "drop one of them", source=where
        )
    for i, bucket in enumerate(workload.buckets):
        plan = bucket.level_plan
        given = {
            "duration_s": plan.duration_s is not None,
            "warmup": bool(plan.warmup_requests or plan.warmup_s),
            "cooldown": bool(plan.cooldown_requests or plan.cooldown_s),
            "mix": bucket.mix is not None,
        }
        for field in (name for name, is_set in given.items() if is_set):
            raise KvplanError(
                f"buckets[{i}].{field}",
                "is not supported with sessions (dataset.sessions): a session level runs each of its sessions once",
                f"drop {field}",
                source=where,
            )
