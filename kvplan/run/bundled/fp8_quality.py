"""What an FP8 KV cache costs in quality: one model, its KV in fp8 against its KV in the model dtype.

Two engines run the same weights in the same dtype with the same settings and a pool of the same
number of blocks, large enough that no request waits for blocks or is preempted, so they schedule
the same batches step for step; only the KV cache dtype differs. The fp8 engine's scales
come from ``LLMEngine.calibrate_kv_scales`` on the caller's calibration prompts (the bench keeps
them apart from the measured ones; a load test uses the run's own calibration prompts).

- Greedy agreement over the first T generated tokens (``ignore_eos``, so both produce T tokens).
  For prompt i, ``first_divergence_i`` is the number of leading positions where the fp8 engine's
  token equals the reference's (T when all agree).
  ``prefix_agreement`` = mean_i first_divergence_i / T: the mean fraction of the T positions that
  agree up to the first divergence (a token after a divergence is never counted, even if equal).
  ``exact_match_rate`` = the fraction of prompts whose T tokens are all identical.
- Teacher-forced KL: each prompt followed by its real reply's first T tokens, scored by both engines
  through the paged cache (``SamplingParams.num_prompt_logits``: every position's K/V is written to
  and read back from the cache, so the fp8 path is really used). At each reply position j, with p the
  reference's and q the fp8 engine's next-token distribution (softmax of the logits predicting reply
  token j): KL(p || q) = sum_v p(v) (ln p(v) - ln q(v)), in nats (Kullback & Leibler, 1951).
  ``mean_kl`` is the mean over all reply positions of all prompts, each position weighted once;
  ``top1_agreement`` the fraction of those positions where both engines' argmax token is the same.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import torch

from kvplan.errors import KvplanError
from kvplan.results.run_result import Fp8QualityResult, KvScales


@dataclass(frozen=True)
class QualityPrompt:
    """A prompt and the first T tokens of its real reply (token ids); source names the record."""

    prompt_token_ids: tuple[int, ...]
    reply_token_ids: tuple[int, ...]
    source: str


@dataclass(frozen=True)
class GreedyAgreement:
    """first_divergence: per prompt, the leading positions (of num_tokens) that agree."""

    num_tokens: int
    first_divergence: tuple[int, ...]

    @property
    def prefix_agreement(self) -> float:
        return sum(self.first_divergence) / (len(self.first_divergence) * self.num_tokens)

    @property
    def exact_match_rate(self) -> float:
        return sum(d == self.num_tokens for d in self.first_divergence) / len(self.first_divergence)


def leading_agreement(reference: Sequence[int], candidate: Sequence[int]) -> int:
    """Positions that agree before the first difference (a length difference counts as one)."""
    n = 0
    for a, b in zip(reference, candidate):
        if a != b:
            break
        n += 1
    return n


def greedy_agreement(
    references: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]], num_tokens: int
) -> GreedyAgreement:
    """Compare each pair's first ``num_tokens`` tokens. Raises ValueError: no pairs, or unequal counts."""
    if not references or len(references) != len(candidates):
        raise ValueError(f"need equally many token lists (got {len(references)} and {len(candidates)})")
    return GreedyAgreement(
        num_tokens, tuple(leading_agreement(r[:num_tokens], c[:num_tokens]) for r, c in zip(references, candidates))
    )


def kl_divergence(reference_logits: torch.Tensor, candidate_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(reference) || softmax(candidate)) per row, in nats.

    reference_logits, candidate_logits: [n, vocab] (any float dtype; computed in fp64). Returns [n].
    """
    log_p = torch.log_softmax(reference_logits.double(), dim=-1)
    log_q = torch.log_softmax(candidate_logits.double(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


@dataclass(frozen=True)
class Fp8Quality:
    """One quality check's numbers (see the module docstring for each definition)."""

    model: str
    dtype: str  # weights and the reference KV cache
    prompts: str  # where the prompts came from
    num_prompts: int
    num_tokens: int
    num_calibration_prompts: int
    prefix_agreement: float
    exact_match_rate: float
    mean_first_divergence: float  # tokens
    num_kl_positions: int
    mean_kl: float  # nats
    max_kl: float  # nats
    top1_agreement: float
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def sharegpt_quality_prompts(
    tokenizer, count: int, num_tokens: int, max_prompt_tokens: int = 1024
) -> list[QualityPrompt]:
    """The first ``count`` ShareGPT conversations (file order) whose first human turn, chat-templated,
    is <= ``max_prompt_tokens`` and whose reply has >= ``num_tokens`` tokens; the reply is cut to
    ``num_tokens``, so every prompt weighs the same in the KL mean.

    Raises:
        KvplanError: fewer usable conversations than ``count``.
    """
    from kvplan.traffic.prompts import read_sharegpt, sharegpt_pairs

    chosen = []
    for index, human, reply in sharegpt_pairs(read_sharegpt()):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": human}], add_generation_prompt=True, tokenize=True
        )["input_ids"]
        reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
        if len(prompt) <= max_prompt_tokens and len(reply_ids) >= num_tokens:
            chosen.append(QualityPrompt(tuple(prompt), tuple(reply_ids[:num_tokens]), f"sharegpt:{index}"))
            if len(chosen) == count:
                return chosen
    raise KvplanError(
        "fp8_quality.num_prompts",
        f"only {len(chosen)} ShareGPT conversations fit (asked for {count})",
        "lower the number of prompts or tokens",
    )


def random_quality_prompts(
    vocab_size: int, count: int, num_tokens: int, max_prompt_tokens: int, seed: int = 0
) -> list[QualityPrompt]:
    """Random token ids for a model without a tokenizer: prompts of 1..max_prompt_tokens tokens and
    random "replies" of ``num_tokens`` (a distribution check, not a real conversation)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_prompt_tokens + 1, (count,), generator=g).tolist()
    return [
        QualityPrompt(
            tuple(torch.randint(0, vocab_size, (n,), generator=g).tolist()),
            tuple(torch.randint(0, vocab_size, (num_tokens,), generator=g).tolist()),
            "random",
        )
        for n in lengths
    ]


def _score(engine, prompts: Sequence[QualityPrompt]) -> list[torch.Tensor]:
    """Logits predicting each reply token, [len(reply), vocab] per prompt: the engine scores
    prompt + reply[:-1] and returns its last len(reply) positions."""
    from engine.request import SamplingParams

    seqs = [list(p.prompt_token_ids + p.reply_token_ids[:-1]) for p in prompts]
    params = [SamplingParams(max_tokens=1, num_prompt_logits=len(p.reply_token_ids)) for p in prompts]
    return [o.prompt_logits for o in engine.generate(seqs, params)]


def _pool_blocks(config, prompts: Sequence[QualityPrompt], num_tokens: int) -> int:
    """Blocks for the ``max_num_seqs`` largest requests (prompt + num_tokens) at once: whatever the
    scheduler admits fits, so neither engine ever preempts."""
    sizes = sorted((-(-(len(p.prompt_token_ids) + num_tokens) // config.block_size) for p in prompts), reverse=True)
    return sum(sizes[: config.max_num_seqs])


def run_fp8_quality(
    config,
    prompts: Sequence[QualityPrompt],
    calibration_prompts: Sequence[Sequence[int]],
    num_tokens: int,
    prompts_label: str,
    batch_size: int = 16,
) -> Fp8Quality:
    """Build the reference engine (``config`` with KV in the model dtype) and the fp8 engine (same
    config, scales calibrated on ``calibration_prompts``), both with ``_pool_blocks`` blocks, then
    measure.

    config: an ``engine.config.EngineConfig``. prompts: each reply exactly ``num_tokens`` long.
    batch_size: prompts scored at once (bounds the logits held: 2 x batch x T x vocab x 4 bytes).

    Raises:
        ValueError: a prompt + num_tokens above the engines' max_model_len.
    """
    from engine.llm_engine import LLMEngine
    from engine.request import SamplingParams

    start = time.perf_counter()
    pool = {"num_blocks": _pool_blocks(config, prompts, num_tokens), "kv_cache_memory_bytes": None}
    reference = LLMEngine(replace(config, kv_cache_dtype="auto", **pool))
    fp8 = LLMEngine(replace(config, kv_cache_dtype="fp8", **pool))
    longest = max(len(p.prompt_token_ids) for p in prompts) + num_tokens
    if longest > reference.max_model_len:
        raise ValueError(f"prompts: {longest} tokens with the reply > max_model_len {reference.max_model_len}")
    fp8.calibrate_kv_scales([list(p) for p in calibration_prompts])
    ids = [list(p.prompt_token_ids) for p in prompts]
    greedy = SamplingParams(max_tokens=num_tokens, ignore_eos=True)
    agreement = greedy_agreement(
        [o.output_token_ids for o in reference.generate(ids, greedy)],
        [o.output_token_ids for o in fp8.generate(ids, greedy)],
        num_tokens,
    )
    kls, same_top1 = [], 0
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i : i + batch_size]
        for ref, test in zip(_score(reference, batch), _score(fp8, batch)):
            kls.append(kl_divergence(ref, test))
            same_top1 += int((ref.argmax(-1) == test.argmax(-1)).sum())
    kl = torch.cat(kls)
    return Fp8Quality(
        model=reference.model_name,
        dtype=str(reference.dtype).removeprefix("torch."),
        prompts=prompts_label,
        num_prompts=len(prompts),
        num_tokens=num_tokens,
        num_calibration_prompts=len(calibration_prompts),
        prefix_agreement=agreement.prefix_agreement,
        exact_match_rate=agreement.exact_match_rate,
        mean_first_divergence=sum(agreement.first_divergence) / len(prompts),
        num_kl_positions=kl.numel(),
        mean_kl=kl.mean().item(),
        max_kl=kl.max().item(),
        top1_agreement=same_top1 / kl.numel(),
        seconds=time.perf_counter() - start,
    )


# ---- the load test's fp8 hooks ---------------------------------------------------------------
def _calibration_prompts(workload, requests: dict) -> list[list[int]]:
    """The first ``fp8_quality.num_calibration_prompts`` sampled requests, buckets in order."""
    prompts = [list(r.prompt_token_ids) for reqs in requests.values() for r in reqs]
    return prompts[: workload.fp8_quality.num_calibration_prompts]


def calibrate_for_run(engine, workload, requests: dict) -> KvScales:
    """Calibrate ``engine``'s fp8 scales on a few of the workload's own prompts, before its first
    step; returns the record kept in the run's engine facts (scales per layer, K then V).
    A quality check that cannot run on this engine fails here, before the run (KvplanError)."""
    if workload.fp8_quality.num_prompts:
        _max_prompt_tokens(engine, workload)
    scales = engine.calibrate_kv_scales(_calibration_prompts(workload, requests))
    return KvScales(
        num_calibration_prompts=scales.num_prompts,
        num_calibration_tokens=scales.num_tokens,
        k_scales=list(scales.k_scales),
        v_scales=list(scales.v_scales),
    )


def _max_prompt_tokens(engine, workload) -> int:
    """Longest quality-check prompt: 1024 tokens, or less so that prompt + num_tokens fits
    max_model_len. Raises KvplanError when no prompt fits."""
    num_tokens = workload.fp8_quality.num_tokens
    if engine.max_model_len - num_tokens < 1:
        raise KvplanError(
            "fp8_quality.num_tokens",
            f"must be < max_model_len {engine.max_model_len} (got {num_tokens})",
            source=workload.source,
        )
    return min(1024, engine.max_model_len - num_tokens)


def check_for_run(engine, workload, requests: dict) -> Fp8QualityResult:
    """The quality check at the workload's ``fp8_quality`` size, on engines built like ``engine``
    (its config, KV in the model dtype against fp8 calibrated on the run's calibration prompts).
    ShareGPT prompts when the model has a tokenizer, else random token ids."""
    settings = workload.fp8_quality
    num_tokens = settings.num_tokens
    max_prompt_tokens = _max_prompt_tokens(engine, workload)
    if engine.tokenizer is not None:
        prompts = sharegpt_quality_prompts(engine.tokenizer, settings.num_prompts, num_tokens, max_prompt_tokens)
        label = "ShareGPT: first human turn (chat template) + its real reply"
    else:
        prompts = random_quality_prompts(
            engine.hf_config.vocab_size,
            settings.num_prompts,
            num_tokens,
            min(64, max_prompt_tokens),
            seed=workload.seed,
        )
        label = "random token ids (the model has no tokenizer)"
    quality = run_fp8_quality(engine.config, prompts, _calibration_prompts(workload, requests), num_tokens, label)
    return Fp8QualityResult(**quality.to_dict())
