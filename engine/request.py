"""Requests: what a client asks for, and the per-request state the scheduler advances.

Progress is counted in tokens, as in vLLM v1: a request holds ``num_tokens`` known tokens
(prompt + generated so far) of which ``num_computed_tokens`` already have K/V in the cache.
Each step the scheduler gives it ``num_new_tokens`` more to compute; prefill, chunked prefill,
decode and recompute after preemption are all the same rule::

    all_token_ids:  | prompt ................ | output ...... |
                    0            num_computed_tokens      num_tokens
                    |<- K/V in cache ->|<- to compute ->|
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import SEED_LIMIT


class FinishReason:
    """Why a request stopped. Strings, so they go into CSV and JSON unchanged."""

    STOP = "stop"  # produced an EOS token (and ignore_eos was off)
    LENGTH = "length"  # produced max_tokens tokens
    ABORT = "abort"  # abort(request_id): the client went away
    OOM = "oom"  # torch raised a memory error in the step that ran it
    CANNOT_FIT = "cannot_fit"  # over max_model_len, or needs more blocks than the whole cache (or KV budget)
    REJECTED = "rejected"  # refused at the entry by admission (engine.admission); detail "<reason>: ..."


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


GREEDY_BELOW = 1e-5  # temperatures below this sample greedily (vLLM's _SAMPLING_EPS)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each output token.

    temperature 0 means greedy (argmax), and so does any temperature below ``GREEDY_BELOW`` (1e-5,
    vLLM's sampling epsilon: dividing logits by less overflows fp32). Otherwise logits are divided
    by it, then top-p (nucleus) keeps the smallest set of tokens whose probability reaches ``top_p``.
    ``seed`` makes one request's draws reproducible whatever else shares its batch.
    ``min_tokens``: EOS does not end the request before this many output tokens (vLLM's
    ``min_tokens``; vLLM masks EOS from sampling instead, which gives the same lengths).

    ``forced_token_ids``: output token ids emitted instead of the sampled ones, in order (output i
    is ``forced_token_ids[i]`` while i < its length; teacher-forced decoding): a replay of a recorded
    reply, so that a later prompt carrying that reply finds its blocks in the prefix cache, as a
    chat client resending the server's own reply does. Every step still runs the model and the
    sampler; only the token kept differs.

    ``num_prompt_logits`` N > 0 asks for the logits at the last N prompt positions (scoring and
    teacher forcing, like vLLM's ``prompt_logprobs``): ``RequestOutput.prompt_logits`` is then
    [N, vocab_size] fp32, row i the next-token logits after prompt token P - N + i (P = prompt
    length; the last row is the distribution the first output token is drawn from). Such a
    request skips the prefix-cache lookup, so every prompt position is computed through the cache.

    Raises:
        ValueError: naming the field, for max_tokens, seed or num_prompt_logits that is not an
            int, max_tokens < 1, a temperature that is not a finite
            number >= 0, top_p outside (0, 1] (NaN included), a seed outside [0, 2**64) (the range
            of a torch generator's seed), num_prompt_logits < 0, min_tokens < 0 or above max_tokens,
            forced_token_ids that are not a tuple of ints.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    num_prompt_logits: int = 0
    min_tokens: int = 0
    forced_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("max_tokens", "seed", "num_prompt_logits", "min_tokens"):
            value = getattr(self, name)
            if not (isinstance(value, numbers.Integral) and not isinstance(value, bool)) and not (
                name == "seed" and value is None
            ):
                raise ValueError(f"{name}: must be an int (got {value!r})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1 (got {self.max_tokens})")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature: must be a finite number >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:  # also refuses NaN: every comparison with it is False
            raise ValueError(f"top_p: must be in (0, 1] (got {self.top_p})")
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed: must be in [0, 2**64) (got {self.seed})")
        if self.num_prompt_logits < 0:
            raise ValueError(f"num_prompt_logits: must be >= 0 (got {self.num_prompt_logits})")
        forced = self.forced_token_ids
        if forced is not None and not (
            isinstance(forced, tuple) and all(isinstance(t, int) and not isinstance(t, bool) for t in forced)
        ):
            raise ValueError(f"forced_token_ids: must be a tuple of ints (got {type(forced).__name__})")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens: must be in [0, max_tokens {self.max_tokens}] (got {self.min_tokens})")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


@dataclass(eq=False)
class Request:
    """One request's mutable state. The scheduler owns it; others read it.

    Times are ``time.perf_counter()`` seconds (the engine's clock), so differences are latencies.
    ``cache_salt`` enters the first block's prefix-cache hash: requests with different salts never
    share blocks. ``tenant``: who sent it, for admission's per-tenant limits (engine.admission);
    None: no tenant, no per-tenant limit. ``prompt_hashes``: where the prefix-cache hashes of the
    prompt's full blocks come from without reading its tokens (a simulated trace prompt's recipe,
    kvplan.traffic.trace.TracePrompt.block_hashes): called with the block size, the cache salt and
    a count, it gives the chained hashes of the prompt's first ``count`` full blocks, or None (then
    the tokens are hashed, engine.block_hash). Every request of one engine must then take its
    hashes from such a source, whose hashes agree exactly where the tokens and salts do; None: the
    tokens are hashed.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    arrival_time: float
    cache_salt: str | None = None
    tenant: str | None = None
    prompt_hashes: Callable[[int, str | None, int], list[bytes] | None] | None = field(default=None, repr=False)

    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    finish_reason: str | None = None
    finish_detail: str = ""
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return [*self.prompt_token_ids, *self.output_token_ids]

    def token_ids_between(self, start: int, end: int) -> tuple[int, ...]:
        """``all_token_ids[start:end]`` without building the whole list (a decode step asks for
        one token of a long request every step)."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        outputs = tuple(self.output_token_ids[max(start - num_prompt, 0) : end - num_prompt])
        return self.prompt_token_ids[start:] + outputs if start < num_prompt else outputs

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
