"""A benchmark client's protocol as a bucket's ``protocol:``: lengths, counts, warm-up and arrivals
drawn as that client draws them, so a kvplan level answers the question its run answered.

Two clients, each read in its own source:

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

Counts scale with the level's concurrency C: N = ``num_prompts_per_concurrency`` x C, W =
``warmup_per_concurrency`` x C.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from kvplan.results.stats.steady import LevelSchedule
from kvplan.workload.lengths import Lengths, StrictModel

ProtocolKind = Literal["vllm_bench_serve", "inferencex"]


class BenchProtocol(StrictModel):
    """How a benchmark client draws one bucket's levels (module docstring). The bucket gives
    ``input_tokens`` and ``output_tokens`` as one length each (L, the client's ``--random-input-len``
    and ``--random-output-len``) and concurrency levels only.

    Raises (validation):
        ValueError: ``random_range_ratio`` outside the kind's range ([0, 1) for vllm_bench_serve,
            (0, 1] for inferencex).
    """

    kind: ProtocolKind = Field(
        description="The client: ``vllm_bench_serve`` (vLLM 0.32's ``vllm bench serve``, lengths in"
        " [L(1-r), L(1+r)]) or ``inferencex`` (InferenceX's benchmark_serving.py, lengths in [rL, L])."
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
    input_len: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="The client's ``--random-input-len`` L, tokens; null = the bucket's ``input_tokens``"
        " (one length), which then holds the range drawn around it.",
    )
    output_len: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="The client's ``--random-output-len`` L, tokens; null = the bucket's ``output_tokens``.",
    )
    warmup_per_concurrency: Annotated[int, Field(ge=0)] = Field(
        0,
        description="Warm-up requests per unit of concurrency (``--num-warmups`` = this x C): copies of the"
        " first prompt, finished before the measured requests are sent, counted in no statistic.",
    )

    @model_validator(mode="after")
    def _ratio(self) -> BenchProtocol:
        r = self.random_range_ratio
        if self.kind == "vllm_bench_serve" and not 0 <= r < 1:
            raise ValueError(f"random_range_ratio must lie in [0, 1) for vllm_bench_serve (got {r})")
        if self.kind == "inferencex" and not 0 < r <= 1:
            raise ValueError(f"random_range_ratio must lie in (0, 1] for inferencex (got {r})")
        return self

    def lengths(self, length: int) -> Lengths:
        """The range the client draws a length from, given its nominal ``length`` L (tokens);
        uniform integers, inclusive. vLLM keeps an output length >= 1."""
        r = self.random_range_ratio
        if self.kind == "vllm_bench_serve":
            low, high = math.floor(length * (1 - r)), math.ceil(length * (1 + r))
        else:
            low, high = math.floor(length * r), length
        low = max(low, 1)  # an empty prompt is refused; vLLM floors an output at 1
        if low == high:
            return Lengths(min=low, max=high, dist="fixed")
        return Lengths(min=low, max=high)

    def schedule(self) -> LevelSchedule:
        """Each level's measured and warm-up counts per unit of its concurrency (``at(C)`` gives
        the level's own), the warm-up drained first."""
        return LevelSchedule(
            num_requests=self.num_prompts_per_concurrency,
            warmup_requests=self.warmup_per_concurrency,
            warmup_drained=self.warmup_per_concurrency > 0,
            per_concurrency=True,
        )

    def num_requests(self, concurrency: list[int]) -> int:
        """Requests to sample for a bucket of these levels: the largest level's measured count."""
        return self.num_prompts_per_concurrency * max(concurrency)
