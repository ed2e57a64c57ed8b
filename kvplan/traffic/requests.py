"""The requests a load test sends: sampled once per bucket, replayed at every load level."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

Tokenize = Callable[[list[str]], list[list[int]]]  # texts -> token ids, batched


@dataclass(frozen=True)
class SampledRequest:
    """One request of a bucket: prompt token ids and the output length (``max_tokens``, tokens)."""

    # a tuple, or a trace's kvplan.traffic.trace.TracePrompt (built when read; tuple() it once to send)
    prompt_token_ids: Sequence[int]
    max_tokens: int
    source: str  # "sharegpt:<record index>", "jsonl:<line>", "random"
    num_prefix_tokens: int = 0  # leading prompt tokens that are a shared prefix
    prefix_group: int | None = None  # which shared prefix (0 .. num_prefixes - 1); None: none
    tenant: int | None = None  # 0 .. num_tenants - 1 in a shared_prefix workload
    request_class: str | None = None  # the bucket's mix class it was drawn from; None: no mix
    reply_token_ids: tuple[int, ...] | None = None  # a session turn's recorded reply, emitted as its output
    # a session's turn (kvplan.traffic.sessions): the session's index in its bucket, the turn (1-based)
    # and the pause, s, between the previous turn's finish and this turn's arrival (0 for turn 1)
    session: int | None = None
    turn: int | None = None
    think_time_s: float = 0.0
    tenant_name: str | None = None  # its mix class's ``tenant``

    @property
    def admission_tenant(self) -> str | None:
        """The tenant admission counts it under (kvplan.workload.admission): its mix class's tenant,
        else its shared_prefix tenant's number, else None."""
        return self.tenant_name if self.tenant_name is not None else None if self.tenant is None else str(self.tenant)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + output: the tokens of KV this request holds when it finishes."""
        return len(self.prompt_token_ids) + self.max_tokens


@dataclass(frozen=True)
class SampledBuckets:
    """Per bucket name, its requests; plus what the dataset read, for the run's metadata."""

    requests: dict[str, list[SampledRequest]]
    dataset_info: dict[str, object]
