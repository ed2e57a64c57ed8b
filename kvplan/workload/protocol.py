"""A benchmark client's protocol as a bucket's ``protocol:``: lengths, counts, warm-up and arrivals
drawn as that client draws them, so a kvplan level answers the question its run answered.

Four clients, each read in its own source:

``vllm_bench_serve``: vLLM 0.32.0's ``vllm bench serve`` (vllm/benchmarks/serve.py,
vllm/benchmarks/datasets/utils.py ``get_sampling_params``) with ``--dataset-name random
--random-input-len L_in --random-output-len L_out --random-range-ratio r --num-prompts N
--max-concurrency C --request-rate inf --ignore-eos --num-warmups W``::

    lengths   integers uniform in [floor(L (1 - r)), ceil(L (1 + r))], 0 <= r < 1 (output >= 1)
    warm-up   W copies of the first prompt, through the same concurrency limit, all finished
              (asyncio.gather) before the measured run starts
    measured  N requests, a closed loop of C: the first C reach the server together, each
              completion sends the next; every one of the N counted

``inferencex``: SemiAnalysis InferenceX's copy of vLLM's benchmark_serving.py as its single-node
scripts run it (github SemiAnalysisAI/InferenceX at 51e31df4a, benchmarks/benchmark_lib.sh
``run_benchmark_serving``; ``--random-range-ratio 0.8 --num-prompts $((CONC * 10)) --num-warmups
$((2 * CONC))``): the same, but lengths uniform in [floor(r L), L], 0 < r <= 1 (the row's ISL and
OSL are the top of the range).

For these two, counts scale with the level's concurrency C: N = ``num_prompts_per_concurrency`` x
C, W = ``warmup_per_concurrency`` x C.

``aiperf``: AIPerf 0.13.0's ``aiperf profile --concurrency C`` (burst mode: C requests at once, each
completion sends the next) on a synthetic dataset, ``--isl L_in --isl-stddev s_in --osl L_out
--osl-stddev s_out --request-count N --warmup-request-count W``::

    lengths   max(1, ceil(Normal(L, s) truncated at 0)), L alone for s = 0 (kvplan.workload.client_draws)
    warm-up   W ordinary dataset prompts at concurrency C, all returned before the profiling phase
              starts (aiperf/timing/phase_orchestrator.py ``_execute_phases``: a phase waits for its
              returns unless the next is ``seamless``, which no CLI flag sets), kept out of the
              results (aiperf/config/phases.py: a warm-up phase is always ``exclude_from_results``)
    measured  N requests (``--request-count``; unset, 10: aiperf/config/flags/_converter_profiling.py
              ``_validate_profiling`` sets ``requests`` 10 when no stop condition is given, although
              the flag's help in aiperf/config/flags/cli_config.py says max(10, 2 x concurrency))

AIPerf's defaults: ``--isl`` 550, ``--isl-stddev`` 0, ``--osl`` none (the server's own limit; kvplan
needs the bucket's ``output_tokens``), ``--osl-stddev`` 0, no warm-up. Its warm-up and profiling
draw from one pool of ``--request-count`` entries (aiperf/config/flags/_converter_dataset.py
``_resolve_entries``; a shuffle sampler, aiperf/dataset/dataset_samplers.py), so prompts repeat;
kvplan sends the bucket's first W prompts as the warm-up and cycles its N prompts after them.

``guidellm``: GuideLLM 0.8.1's ``guidellm benchmark run --profile concurrent --rate C
--max-requests N --warmup w --cooldown d`` on ``synthetic_text`` data (``prompt_tokens``,
``prompt_tokens_stdev``, ``prompt_tokens_min``, ``prompt_tokens_max``, the same for output)::

    lengths   guidellm/utils/random.py IntegerRangeSampler (kvplan.workload.client_draws)
    sent      N requests in all (guidellm/scheduler/constraints/request.py: ``max_requests`` stops
              creating requests at N), C streams each sending its next on a completion
              (guidellm/scheduler/strategies.py ``ConcurrentStrategy``)
    excluded  the first W and the last D of them, sent under full load, none drained; W, D from
              w and d (guidellm/schemas/benchmark/transient.py: < 1 a fraction of N, >= 1 a count)

GuideLLM's defaults (guidellm/schemas/benchmark/profiles/profile.py, entrypoints.py): no warm-up, no
cool-down, no request limit (kvplan needs ``max_requests``). GuideLLM draws its window by time
(the measured requests are those that overlap [the start of the request around the W+1-th
completion, the completion around the N-D-th]); kvplan leaves out the first W and the last D sent,
so GuideLLM's window may also count the requests in flight at its two edges.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from kvplan.results.stats.steady import LevelSchedule
from kvplan.workload import client_draws
from kvplan.workload.lengths import Lengths, StrictModel

ProtocolKind = Literal["vllm_bench_serve", "inferencex", "aiperf", "guidellm"]
VLLM_KINDS = ("vllm_bench_serve", "inferencex")
AIPERF_REQUEST_COUNT = 10  # aiperf 0.13.0 _converter_profiling.py: requests when no stop condition is given
Tokens = Annotated[int, Field(ge=1)]
Stddev = Annotated[int, Field(ge=0)]
Transient = Annotated[float, Field(ge=0, allow_inf_nan=False)]

# which kinds each optional key belongs to (kvplan.workload.protocol's module docstring)
KIND_KEYS: dict[str, tuple[str, ...]] = {
    "random_range_ratio": VLLM_KINDS,
    "num_prompts_per_concurrency": VLLM_KINDS,
    "warmup_per_concurrency": VLLM_KINDS,
    "input_stddev": ("aiperf", "guidellm"),
    "output_stddev": ("aiperf", "guidellm"),
    "request_count": ("aiperf",),
    "warmup_request_count": ("aiperf",),
    "max_requests": ("guidellm",),
    "warmup": ("guidellm",),
    "cooldown": ("guidellm",),
    "input_min": ("guidellm",),
    "input_max": ("guidellm",),
    "output_min": ("guidellm",),
    "output_max": ("guidellm",),
}


class BenchProtocol(StrictModel):
    """How a benchmark client draws one bucket's levels (module docstring). The bucket gives
    ``input_tokens`` and ``output_tokens`` as one length each (L: the client's ``--random-input-len``,
    ``--isl`` or ``prompt_tokens`` and their output twins) and concurrency levels only.

    Raises (validation):
        ValueError: ``random_range_ratio`` outside the kind's range ([0, 1) for vllm_bench_serve,
            (0, 1] for inferencex); a key of another kind (``KIND_KEYS``) given; guidellm without
            ``max_requests``, with a stddev of 0, or with warm-up and cool-down leaving nothing.
    """

    kind: ProtocolKind = Field(
        description="The client: ``vllm_bench_serve`` (vLLM 0.32's ``vllm bench serve``, lengths in"
        " [L(1-r), L(1+r)]), ``inferencex`` (InferenceX's benchmark_serving.py, lengths in [rL, L]),"
        " ``aiperf`` (AIPerf 0.13.0, ``--concurrency``) or ``guidellm`` (GuideLLM 0.8.1, ``--profile concurrent``)."
    )
    random_range_ratio: float = Field(
        0.0,
        allow_inf_nan=False,
        description="The client's ``--random-range-ratio`` r: [0, 1) for vllm_bench_serve (0: fixed"
        " lengths), (0, 1] for inferencex (1: fixed).",
    )
    num_prompts_per_concurrency: Annotated[int, Field(ge=1)] = Field(
        10, description="Measured requests per level, per unit of concurrency (``--num-prompts`` = this x C)."
    )
    input_len: Tokens | None = Field(
        None,
        description="The client's nominal input length L (``--random-input-len``, ``--isl``, ``prompt_tokens``),"
        " tokens; null = the bucket's ``input_tokens`` (one length), which then holds the range drawn around it.",
    )
    output_len: Tokens | None = Field(
        None,
        description="The client's nominal output length L (``--random-output-len``, ``--osl``,"
        " ``output_tokens``), tokens; null = the bucket's ``output_tokens``.",
    )
    warmup_per_concurrency: Annotated[int, Field(ge=0)] = Field(
        0,
        description="Warm-up requests per unit of concurrency (``--num-warmups`` = this x C): copies of the"
        " first prompt, finished before the measured requests are sent, counted in no statistic.",
    )
    input_stddev: Stddev | None = Field(
        None,
        description="aiperf and guidellm: the input length's standard deviation, tokens (``--isl-stddev``,"
        " ``prompt_tokens_stdev``); null = none (aiperf: 0, fixed lengths; guidellm: > 0 when given).",
    )
    output_stddev: Stddev | None = Field(
        None,
        description="aiperf and guidellm: the output length's standard deviation, tokens (``--osl-stddev``,"
        " ``output_tokens_stdev``); null = none.",
    )
    request_count: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="aiperf: measured requests per level (``--request-count``); null = 10, AIPerf 0.13.0's default.",
    )
    warmup_request_count: Annotated[int, Field(ge=0)] = Field(
        0,
        description="aiperf: warm-up requests per level (``--warmup-request-count``), ordinary prompts at the"
        " level's concurrency, all finished before the measured ones are sent; 0 = none (AIPerf's default).",
    )
    max_requests: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="guidellm: requests sent per level, warm-up and cool-down included (``--max-requests``);"
        " required for guidellm.",
    )
    warmup: Transient = Field(
        0.0,
        description="guidellm: ``--warmup``, requests at each level's start kept out of the statistics"
        " but not drained: < 1 a fraction of max_requests (int(w x max_requests)), >= 1 a count; 0 = none.",
    )
    cooldown: Transient = Field(
        0.0,
        description="guidellm: ``--cooldown``, the same at each level's end; 0 = none.",
    )
    input_min: Tokens | None = Field(None, description="guidellm: ``prompt_tokens_min``, tokens; null = its default.")
    input_max: Tokens | None = Field(None, description="guidellm: ``prompt_tokens_max``, tokens; null = its default.")
    output_min: Tokens | None = Field(None, description="guidellm: ``output_tokens_min``, tokens; null = its default.")
    output_max: Tokens | None = Field(None, description="guidellm: ``output_tokens_max``, tokens; null = its default.")

    @model_validator(mode="after")
    def _per_kind(self) -> BenchProtocol:
        # by value, not by fields set: a stored run's config (every default written out) validates again
        for key, kinds in KIND_KEYS.items():
            if self.kind not in kinds and getattr(self, key) != type(self).model_fields[key].default:
                raise ValueError(f"{key} applies to {' and '.join(kinds)} only (kind is {self.kind}): drop {key}")
        r = self.random_range_ratio
        if self.kind == "vllm_bench_serve" and not 0 <= r < 1:
            raise ValueError(f"random_range_ratio must lie in [0, 1) for vllm_bench_serve (got {r})")
        if self.kind == "inferencex" and not 0 < r <= 1:
            raise ValueError(f"random_range_ratio must lie in (0, 1] for inferencex (got {r})")
        if self.kind == "guidellm":
            for key in ("input_stddev", "output_stddev"):
                if getattr(self, key) == 0:
                    raise ValueError(f"{key} must be > 0 for guidellm (its *_tokens_stdev); null = none")
            if self.max_requests is None:
                raise ValueError("guidellm needs max_requests (--max-requests; GuideLLM's default has no limit)")
            if self.measured_requests < 1:
                raise ValueError(
                    f"warmup {self.warmup:g} and cooldown {self.cooldown:g} leave no measured request of"
                    f" max_requests {self.max_requests}: lower them or raise max_requests"
                )
        return self

    def lengths(self, length: int, side: str = "input") -> Lengths:
        """The range the client draws a length from, given its nominal ``length`` L (tokens) for
        ``side`` (input or output): uniform integers, inclusive, for the vLLM clients (vLLM keeps
        an output length >= 1); kvplan.workload.client_draws for aiperf and guidellm.

        Raises:
            ValueError: guidellm's range for the side is empty or leaves out L with a stddev.
        """
        stddev = getattr(self, f"{side}_stddev")
        if self.kind == "aiperf":
            return client_draws.aiperf_lengths(length, stddev or 0)
        if self.kind == "guidellm":
            low, high = getattr(self, f"{side}_min"), getattr(self, f"{side}_max")
            try:
                return client_draws.guidellm_lengths(length, stddev, low, high)
            except ValueError as err:
                raise ValueError(f"{side}_min/{side}_max: {err}") from None
        r = self.random_range_ratio
        if self.kind == "vllm_bench_serve":
            low, high = math.floor(length * (1 - r)), math.ceil(length * (1 + r))
        else:
            low, high = math.floor(length * r), length
        low = max(low, 1)  # an empty prompt is refused; vLLM floors an output at 1
        if low == high:
            return Lengths(min=low, max=high, dist="fixed")
        return Lengths(min=low, max=high)

    @property
    def warmup_requests(self) -> int:
        """aiperf and guidellm: each level's warm-up requests (guidellm's from its fraction or count)."""
        if self.kind == "guidellm":
            return client_draws.guidellm_transient(self.warmup, self.max_requests or 0)
        return self.warmup_request_count

    @property
    def cooldown_requests(self) -> int:
        """guidellm: each level's cool-down requests; 0 for the other kinds."""
        if self.kind != "guidellm":
            return 0
        return client_draws.guidellm_transient(self.cooldown, self.max_requests or 0)

    @property
    def measured_requests(self) -> int:
        """aiperf and guidellm: each level's measured requests (the same at every level)."""
        if self.kind == "guidellm":
            return (self.max_requests or 0) - self.warmup_requests - self.cooldown_requests
        return self.request_count if self.request_count is not None else AIPERF_REQUEST_COUNT

    def schedule(self) -> LevelSchedule:
        """Each level's measured and warm-up counts: per unit of its concurrency for the vLLM
        clients (``at(C)`` gives the level's own), the warm-up drained first; the same at every
        level for aiperf (its warm-up ordinary prompts, drained) and guidellm (a warm-up and a
        cool-down sent under load)."""
        if self.kind in VLLM_KINDS:
            return LevelSchedule(
                num_requests=self.num_prompts_per_concurrency,
                warmup_requests=self.warmup_per_concurrency,
                warmup_drained=self.warmup_per_concurrency > 0,
                per_concurrency=True,
            )
        return LevelSchedule(
            num_requests=self.measured_requests,
            warmup_requests=self.warmup_requests,
            cooldown_requests=self.cooldown_requests,
            warmup_drained=self.kind == "aiperf" and self.warmup_requests > 0,
            warmup_copies=False,
            client=self.kind,
        )

    def num_requests(self, concurrency: list[int]) -> int:
        """Requests to sample for a bucket of these levels: the largest level's measured count (a
        warm-up or cool-down cycles them)."""
        if self.kind in VLLM_KINDS:
            return self.num_prompts_per_concurrency * max(concurrency)
        return self.measured_requests

    def check_counts(self, concurrency: list[int], num_requests: int) -> None:
        """aiperf and guidellm: that every level reaches its concurrency and that the bucket's
        ``num_requests`` is the measured count.

        Raises:
            ValueError: a level above the requests it sends (aiperf: the measured ones), or a
                ``num_requests`` other than the protocol's.
        """
        key = "request_count" if self.kind == "aiperf" else "max_requests"
        wanted = self.measured_requests
        sent = wanted if self.kind == "aiperf" else self.max_requests or 0
        if max(concurrency) > sent:
            raise ValueError(
                f"concurrency {max(concurrency)} exceeds the {sent} requests a level sends ({key}):"
                f" raise {key} to >= {max(concurrency)} or drop the level"
            )
        if num_requests != wanted:
            raise ValueError(
                f"num_requests is {num_requests}, the protocol measures {wanted} per level ({key}): drop num_requests"
            )
