"""Shared prefixes for a workload's requests: system prompts or documents that groups share.

With ``shared_prefix`` in the workload YAML, a seeded share of each bucket's requests get one of
the workload's prefixes in front of their own prompt, and every request a tenant::

    prompt_token_ids = | prefix g (num_tokens) | own prompt (input_tokens range) |
                       ^ the same ids for every request of group g, so its full blocks hash
                         the same and the engine's prefix cache can serve them (per cache salt)

The load driver turns tenants into cache salts (kvplan.loadtest.Level.cache_salt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kvplan.errors import KvplanError

if TYPE_CHECKING:  # kvplan.workload imports this module for SharedPrefix
    from kvplan.prompts import SampledRequest, Tokenize
    from kvplan.workload import Workload


class SharedPrefix(BaseModel):
    """The workload's ``shared_prefix:``: a prefix of ``num_tokens`` tokens (a system prompt,
    few-shot examples, a document) in front of requests' own prompts.

    ``num_prefixes`` distinct prefixes (groups); ``fraction`` of each bucket's requests carry one
    (the rest have none); ``num_tenants`` tenants, each with its own cache salt, so a group's
    requests of different tenants never share blocks. For sharegpt a prefix is the first
    ``num_tokens`` tokens of a long real ShareGPT turn; for random and jsonl, random token ids.
    A bucket's ``input_tokens`` range the request's own prompt, after the prefix. Every load
    level then runs twice (kvplan.loadtest): with caching effective and with it defeated.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)  # as kvplan.workload's

    num_tokens: Annotated[int, Field(ge=1)]
    num_prefixes: Annotated[int, Field(ge=1)] = 1
    fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    num_tenants: Annotated[int, Field(ge=1)] = 1


def check_shared_prefix(workload: Workload) -> None:
    """Rules that involve the engine and the buckets.

    Raises:
        KvplanError: prefix caching off, a prefix shorter than one block (nothing to share), or a
            bucket whose shortest request with the prefix exceeds engine.max_model_len.
    """
    prefix, engine = workload.shared_prefix, workload.engine
    if prefix is None:
        return
    if not engine.enable_prefix_caching:
        raise KvplanError(f"{workload.source}: engine.enable_prefix_caching",
                          "shared_prefix needs prefix caching on (got false)", "set engine.enable_prefix_caching: true")
    if prefix.num_tokens < engine.block_size:
        raise KvplanError(f"{workload.source}: shared_prefix.num_tokens",
                          f"must be >= engine.block_size {engine.block_size}: only full blocks are shared"
                          f" (got {prefix.num_tokens})")
    for i, bucket in enumerate(workload.buckets):
        shortest = prefix.num_tokens + bucket.input_tokens.min + bucket.output_tokens.min
        if engine.max_model_len is not None and shortest > engine.max_model_len:
            raise KvplanError(f"{workload.source}: buckets[{i}]",
                              f"shortest request with the shared prefix ({prefix.num_tokens} +"
                              f" {bucket.input_tokens.min} + {bucket.output_tokens.min} = {shortest} tokens)"
                              " exceeds engine.max_model_len"
                              f" {engine.max_model_len}")


_PREFIX_STREAM = 0x5F1C  # seeds the shared-prefix draws apart from the prompt draws


def _sharegpt_prefixes(
    records: Sequence[dict], num_tokens: int, count: int, tokenize: Tokenize, rng: np.random.Generator,
    where: str,
) -> tuple[list[tuple[int, ...]], list[str]]:
    """``count`` prefixes of ``num_tokens`` tokens: the opening tokens of distinct real ShareGPT
    turns (either speaker) at least that long, in a seeded order; a duplicate opening (ShareGPT
    repeats some conversations) is skipped, so the groups' prefixes differ."""
    turns = [
        (f"sharegpt:{i}:{j}", turn["value"])
        for i, record in enumerate(records)
        for j, turn in enumerate(record.get("conversations") or [])
        # skipped untokenised: a turn of fewer characters rarely holds that many tokens
        if isinstance(turn.get("value"), str) and len(turn["value"]) >= num_tokens
    ]
    prefixes, sources = [], []
    order = rng.permutation(len(turns))
    for start in range(0, len(order), 64):
        batch = [turns[i] for i in order[start : start + 64]]
        for (source, _), ids in zip(batch, tokenize([text for _, text in batch])):
            if len(ids) >= num_tokens and tuple(ids[:num_tokens]) not in prefixes:
                prefixes.append(tuple(ids[:num_tokens]))
                sources.append(source)
            if len(prefixes) == count:
                return prefixes, sources
    raise KvplanError(
        f"{where}: shared_prefix.num_tokens",
        f"only {len(prefixes)} ShareGPT turns hold {num_tokens} tokens and num_prefixes asks for {count}",
        "lower num_tokens or num_prefixes",
    )


def _with_prefix(
    requests: list[SampledRequest], prefixes: list[tuple[int, ...]], fraction: float, num_tenants: int,
    rng: np.random.Generator,
) -> list[SampledRequest]:
    """round(fraction x n) requests, chosen by a seeded permutation, carry a prefix; carriers
    take the groups in turn (balanced); tenants are dealt the same way over all n requests."""
    n = len(requests)
    carriers = rng.permutation(n)[: round(fraction * n)]
    group_of = {int(i): k % len(prefixes) for k, i in enumerate(carriers)}
    tenant_of = rng.permutation(n) % num_tenants
    out = []
    for i, req in enumerate(requests):
        group = group_of.get(i)
        prefix = prefixes[group] if group is not None else ()
        out.append(replace(
            req, prompt_token_ids=prefix + req.prompt_token_ids, num_prefix_tokens=len(prefix),
            prefix_group=group, tenant=int(tenant_of[i]),
        ))
    return out


def apply_shared_prefix(
    workload: Workload, requests: dict[str, list[SampledRequest]], tokenize: Tokenize | None,
    vocab_size: int, records: Sequence[dict] = (),
) -> tuple[dict[str, list[SampledRequest]], dict[str, object]]:
    """Put ``workload.shared_prefix``'s prefixes in front of the sampled requests' prompts.

    Prefixes: for sharegpt (``records`` given) real ShareGPT turns tokenised with ``tokenize``;
    otherwise uniform random ids in [0, vocab_size). Deterministic for ``workload.seed``; the
    prompts drawn before are left as they were. Returns the new requests and what was used
    (for the run's metadata).

    Raises:
        KvplanError: too few ShareGPT turns as long as ``shared_prefix.num_tokens``.
    """
    spec = workload.shared_prefix
    rng = np.random.default_rng([workload.seed, _PREFIX_STREAM, 1])
    if workload.dataset.kind == "sharegpt":
        prefixes, sources = _sharegpt_prefixes(
            records, spec.num_tokens, spec.num_prefixes, tokenize, rng, workload.source)
    else:
        prefixes = [tuple(int(t) for t in rng.integers(0, vocab_size, size=spec.num_tokens))
                    for _ in range(spec.num_prefixes)]
        sources = ["random"] * spec.num_prefixes
    out = {
        bucket.name: _with_prefix(requests[bucket.name], prefixes, spec.fraction, spec.num_tenants,
                                  np.random.default_rng([workload.seed, _PREFIX_STREAM, 2, i]))
        for i, bucket in enumerate(workload.buckets)
    }
    return out, {**spec.model_dump(), "sources": sources}
