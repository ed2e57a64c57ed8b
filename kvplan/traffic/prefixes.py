"""Shared prefixes for a workload's requests: system prompts or documents that groups share.

With ``shared_prefix`` in the workload YAML, a seeded share of each bucket's requests get one of
the workload's prefixes in front of their own prompt, and every request a tenant::

    prompt_token_ids = | prefix g (num_tokens) | own prompt (input_tokens range) |
                       ^ the same ids for every request of group g, so its full blocks hash
                         the same and the engine's prefix cache can serve them (per cache salt)

The schema is kvplan.workload.schema.SharedPrefix; the load driver turns tenants into cache salts
(kvplan.run.driver.cache_salt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from kvplan.errors import KvplanError
from kvplan.traffic.requests import SampledRequest, Tokenize
from kvplan.workload.schema import Workload

_PREFIX_STREAM = 0x5F1C  # seeds the shared-prefix draws apart from the prompt draws


def _sharegpt_prefixes(
    records: Sequence[dict],
    num_tokens: int,
    count: int,
    tokenize: Tokenize,
    rng: np.random.Generator,
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
        "shared_prefix.num_tokens",
        f"only {len(prefixes)} ShareGPT turns hold {num_tokens} tokens and num_prefixes asks for {count}",
        "lower num_tokens or num_prefixes",
        source=where,
    )


def _with_prefix(
    requests: list[SampledRequest],
    prefixes: list[tuple[int, ...]],
    fraction: float,
    num_tenants: int,
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
        out.append(
            replace(
                req,
                prompt_token_ids=prefix + tuple(req.prompt_token_ids),
                num_prefix_tokens=len(prefix),
                prefix_group=group,
                tenant=int(tenant_of[i]),
            )
        )
    return out


def apply_shared_prefix(
    workload: Workload,
    requests: dict[str, list[SampledRequest]],
    tokenize: Tokenize | None,
    vocab_size: int,
    records: Sequence[dict] = (),
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
    assert spec is not None  # called for a shared_prefix workload only
    rng = np.random.default_rng([workload.seed, _PREFIX_STREAM, 1])
    if workload.dataset.kind == "sharegpt":
        assert tokenize is not None  # ShareGPT prompts are text: sampling them needed the tokenizer
        prefixes, sources = _sharegpt_prefixes(
            records, spec.num_tokens, spec.num_prefixes, tokenize, rng, workload.source
        )
    else:
        prefixes = [
            tuple(int(t) for t in rng.integers(0, vocab_size, size=spec.num_tokens)) for _ in range(spec.num_prefixes)
        ]
        sources = ["random"] * spec.num_prefixes
    out = {
        bucket.name: _with_prefix(
            requests[bucket.name],
            prefixes,
            spec.fraction,
            spec.num_tenants,
            np.random.default_rng([workload.seed, _PREFIX_STREAM, 2, i]),
        )
        for i, bucket in enumerate(workload.buckets)
    }
    return out, {**spec.model_dump(), "sources": sources}
