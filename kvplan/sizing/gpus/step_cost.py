"""A roofline model of one serving step on a GPU it never ran on: FLOPs, bytes moved, link traffic.

Per GPU rank of a ``tp``-way tensor-parallel server, for a step of ``T`` new tokens (prefill and
decode) over ``S`` sampled sequences, ``C`` context tokens read (sum of every scheduled
sequence's cached + new tokens) and ``P`` causal query-key pairs per head::

    FLOPs = 2 x N_active x T / tp                 N_active: parameters outside the embeddings that
                                                     a token runs (each weight: a multiply-add per token)
          + 2 x vocab x hidden x S / tp           the LM head, on each sampled position only
          + 4 x heads x head_dim x layers x P / tp    Q.K and P.V, a multiply-add each per pair and head dimension
    bytes = W_every / tp                          every weight a step always reads, read once per step
          + L_moe x D(T) x W_expert / tp          the routed experts the step's tokens hit (MoE only)
          + C x KV bytes per token per rank       attention reads each sequence's K/V
          + T x KV bytes per token per rank       the new tokens' K/V written
          + T x layers x (6 x hidden + 3 x intermediate) x 2 / tp   activations (bf16) in and out of each layer
    link  = 2 x layers all-reduces of T x hidden x 2 bytes, a ring moving 2 (tp - 1) / tp of it per rank,
            each also paying ALLREDUCE_LATENCY_S

    step seconds = max(FLOPs / (peak x compute efficiency), bytes / (bandwidth x memory efficiency))
                   + link bytes / link bandwidth + 2 x layers x latency (tp > 1) + step overhead

Attention data parallelism (``dp`` > 1, kvplan.sizing.gpus.data_parallel): the model above prices one
DP rank of ``tp`` GPUs for its own tokens ``T``, except the routed experts, which are split over all
``tp x dp`` GPUs and run every rank's tokens: ``W_expert / (tp x dp)`` per GPU, ``D(dp x T)`` experts
hit (the ranks in balance), the same expert FLOPs per rank token (``dp x T`` tokens over ``dp``
times the GPUs); and each MoE layer moves each token's hidden state to its ``k`` experts and back
(expert-parallel dispatch and combine, as DeepEP does): ``2 x L_moe x k x hidden x 2`` bytes per
token, ``(tp x dp - 1) / (tp x dp)`` of it leaving the GPU, two more latencies per MoE layer.

Dense models: ``N_active`` is every parameter outside the embeddings and ``W_every`` all the
weights. Mixture-of-experts models are priced as they run: of each MoE layer's ``E`` routed
experts a token runs its top ``k`` (``num_experts_per_tok`` of the model config), so

    N_active = N - L_moe x (E - k) x p_expert     p_expert: one routed expert's parameters
    W_every  = weights - L_moe x E x W_expert     dense layers, attention, router, shared experts, embeddings
    D(T)     = E x (1 - (1 - k / E) ^ T)          expected distinct experts per MoE layer hit by T tokens

``D(T)`` is the classical occupancy count (Feller, "An Introduction to Probability Theory and Its
Applications", vol. 1, ch. II, occupancy problems): by linearity of expectation over the ``E``
experts, each missed by one token with probability ``1 - k / E``, so by ``T`` tokens with
``(1 - k / E) ^ T``. It assumes uniform routing, each token's ``k`` experts drawn independently of
the other tokens'; real routers are skewed, which hits fewer experts. One token reads ``k``
experts, a large step all ``E``. Each rank holds ``1 / tp`` of every expert (tensor-parallel
experts, vLLM's default without expert parallelism). A config without ``num_experts_per_tok``
counts every expert for every token (an upper bound).

The roofline is Williams, Waterman and Patterson, "Roofline", CACM 2009; the FLOP count per token is
Kaplan et al. 2020 ("Scaling Laws", 2N per token forward) plus attention. Peak is FP8's for 8-bit
weights (W8A8) where the GPU has FP8 tensor cores, else BF16's; 4-bit floating point weights
(nvfp4, mxfp4) use the GPU's FP4 peak where the GPU figures name one (``fp4_flops``), else FP8's
where it has FP8 tensor cores, else BF16's. Efficiencies and overhead: kvplan.sizing.gpus.gpu_perf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.sizing import dtypes, kv_math
from kvplan.sizing.gpus.gpu_perf import GpuPerf, ServingFit
from kvplan.sizing.models.model_spec import ModelSpec
from kvplan.sizing.models.weights import (
    count_parameters,
    routed_expert_parameters,
    weight_bytes_per_parameter,
    weights_bytes,
)

ALLREDUCE_LATENCY_S = 5e-6  # one small all-reduce between GPUs of a node (order of NCCL / custom all-reduce)
_ACTIVATION_BYTES = 2  # bf16
# bits per weight of the 4-bit floating point formats, as ModelSpec.weight_bits holds them
_FP4_BITS = frozenset(d.bits_per_weight for d in dtypes.FP4_WEIGHT_DTYPES.values())


@dataclass(frozen=True)
class RooflineStepCost:
    """The model above for one model on one GPU type (a CostModel: ``step_seconds``, ``gap_s``).
    Per-rank counts: ``flops_per_token`` (2 x N_active / tp), ``lm_head_flops``,
    ``attention_flops_per_pair``, ``weight_bytes`` (W_every / tp: all the weights of a dense model,
    all but the routed experts of an MoE model), ``kv_bytes_per_token``,
    ``activation_bytes_per_token``, ``link_bytes_per_token``. MoE models: ``moe_layers`` (L_moe),
    ``num_experts`` (E), ``experts_per_token`` (k) and ``expert_bytes`` (one routed expert of one
    layer, per rank: W_expert / tp); all 0 for a dense model."""

    flops_per_token: float
    lm_head_flops: float
    attention_flops_per_pair: float
    weight_bytes: float
    kv_bytes_per_token: float
    activation_bytes_per_token: float
    link_bytes_per_token: float
    num_allreduces: int
    peak_flops: float
    hbm_bytes_per_s: float
    link_bytes_per_s: float
    fit: ServingFit
    gap_s: float = 0.0
    moe_layers: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    expert_bytes: float = 0.0
    dp: int = 1

    def experts_hit(self, tokens: int) -> float:
        """D(T): the expected distinct routed experts per MoE layer that a step of ``tokens`` tokens
        runs, ``E x (1 - (1 - k / E) ^ T)`` (uniform, independent routing; module docstring)."""
        if not self.num_experts:
            return 0.0
        return self.num_experts * (1.0 - (1.0 - self.experts_per_token / self.num_experts) ** tokens)

    def parts(self, work: Any) -> dict[str, float]:
        """Seconds of compute, memory and link of a step of ``work`` (an object with StepWork's
        counts), before efficiencies take their share."""
        tokens = work.num_prefill_tokens + work.num_decode_tokens
        sampled = work.num_decode_tokens + work.num_prefill_seqs
        flops = (
            self.flops_per_token * tokens
            + self.lm_head_flops * sampled
            + self.attention_flops_per_pair * work.num_attended_tokens
        )
        moved = (
            self.weight_bytes
            + self.kv_bytes_per_token * (work.num_context_tokens + tokens)
            + self.activation_bytes_per_token * tokens
        )
        if self.moe_layers:
            moved += self.moe_layers * self.experts_hit(tokens * self.dp) * self.expert_bytes
        return {
            "compute_s": flops / self.peak_flops,
            "memory_s": moved / self.hbm_bytes_per_s,
            "link_s": (
                self.link_bytes_per_token * tokens / self.link_bytes_per_s + self.num_allreduces * ALLREDUCE_LATENCY_S
            )
            if self.num_allreduces
            else 0.0,
        }

    def decode_seconds(self, n: int, contexts: Any) -> Any:
        """``step_seconds`` of decode-only steps of ``n`` decodes over each of ``contexts``
        context tokens (numpy int64 [k]; each decode attends its own context: context =
        attended = C), float for float: seconds [k], ``parts`` and ``step_seconds``' arithmetic in
        the same order over the array."""
        import numpy as np

        c = np.asarray(contexts, dtype=np.int64)
        fit = self.fit
        flops = self.flops_per_token * n + self.lm_head_flops * n + self.attention_flops_per_pair * c
        moved = self.weight_bytes + self.kv_bytes_per_token * (c + n) + self.activation_bytes_per_token * n
        if self.moe_layers:
            moved += self.moe_layers * self.experts_hit(n * self.dp) * self.expert_bytes
        link_s = (
            (self.link_bytes_per_token * n / self.link_bytes_per_s + self.num_allreduces * ALLREDUCE_LATENCY_S)
            if self.num_allreduces
            else 0.0
        )
        compute_s, memory_s = flops / self.peak_flops, moved / self.hbm_bytes_per_s
        return (
            np.maximum(compute_s / fit.compute_efficiency, memory_s / fit.memory_efficiency)
            + link_s
            + fit.step_overhead_s
        )

    def step_seconds(self, work: Any) -> float:
        part = self.parts(work)
        fit = self.fit
        return (
            max(part["compute_s"] / fit.compute_efficiency, part["memory_s"] / fit.memory_efficiency)
            + part["link_s"]
            + fit.step_overhead_s
        )


def roofline(
    spec: ModelSpec,
    gpu: GpuPerf,
    fit: ServingFit,
    tp: int = 1,
    kv_cache_dtype: str = "auto",
    weight_dtype: str = "auto",
    dp: int = 1,
) -> RooflineStepCost:
    """The roofline of ``spec`` served on ``tp`` GPUs of type ``gpu`` (see the module docstring);
    ``dp`` > 1: one DP rank of a ``tp x dp`` instance of an MoE model, the routed experts over all
    its GPUs.

    Raises:
        KvplanError: a config without the sizes that count parameters, a bad tp or dtype.
    """
    embedding, other = count_parameters(spec)
    hidden, layers, vocab_size = spec.hidden_size, spec.num_layers, spec.vocab_size
    assert hidden is not None and vocab_size is not None  # count_parameters raised for a config without them
    kv_per_rank = kv_math.layers_bytes_per_token(kv_math.rank_layer_specs(spec, kv_cache_dtype, tp))
    weights = dtypes.canonical_weight(weight_dtype)
    every_step: float = weights_bytes(spec, weight_dtype)
    active = other
    moe_layers = num_experts = top_k = 0
    expert_bytes = 0.0
    if spec.moe is not None and spec.moe.moe_layers:
        moe_layers, num_experts = len(spec.moe.moe_layers), spec.moe.num_experts
        top_k = spec.moe.experts_per_token or num_experts  # unknown top-k: every expert (an upper bound)
        per_expert = routed_expert_parameters(spec)
        expert_bytes = per_expert * weight_bytes_per_parameter(spec, weight_dtype)[1]
        active = other - moe_layers * (num_experts - top_k) * per_expert
        every_step -= moe_layers * num_experts * expert_bytes
    fp8_weights = weights == "fp8" or (weights == "auto" and spec.weight_bits == 8)
    fp4_weights = weights in dtypes.FP4_WEIGHT_DTYPES or (weights == "auto" and spec.weight_bits in _FP4_BITS)
    fp4_peak = getattr(gpu, "fp4_flops", None)  # GpuPerf figures may name no FP4 peak
    if fp4_weights and fp4_peak:
        peak = fp4_peak
    elif (fp8_weights or fp4_weights) and gpu.fp8_flops:
        peak = gpu.fp8_flops
    else:
        peak = gpu.bf16_flops
    link_bytes = 2 * layers * hidden * _ACTIVATION_BYTES * 2 * (tp - 1) / tp if tp > 1 else 0.0
    num_links = 2 * layers if tp > 1 else 0
    if dp > 1 and moe_layers:  # expert-parallel dispatch and combine over the tp x dp GPUs
        link_bytes += 2 * moe_layers * top_k * hidden * _ACTIVATION_BYTES * (tp * dp - 1) / (tp * dp)
        num_links += 2 * moe_layers
    return RooflineStepCost(
        flops_per_token=2 * active / tp,
        lm_head_flops=2 * vocab_size * hidden / tp,
        attention_flops_per_pair=4 * spec.num_attention_heads * spec.head_dim * layers / tp,
        weight_bytes=every_step / tp,
        kv_bytes_per_token=kv_per_rank,
        activation_bytes_per_token=layers
        * (6 * hidden + 3 * (spec.intermediate_size or 4 * hidden))
        * _ACTIVATION_BYTES
        / tp,
        link_bytes_per_token=link_bytes,
        num_allreduces=num_links,
        peak_flops=peak,
        hbm_bytes_per_s=gpu.hbm_bytes_per_s,
        link_bytes_per_s=gpu.link_bytes_per_s,
        fit=fit,
        moe_layers=moe_layers,
        num_experts=num_experts,
        experts_per_token=top_k,
        expert_bytes=expert_bytes / (tp * dp) if moe_layers else 0.0,
        dp=dp if moe_layers else 1,
    )
