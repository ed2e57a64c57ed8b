"""A roofline model of one serving step on a GPU it never ran on: FLOPs, bytes moved, link traffic.

Per GPU rank of a ``tp``-way tensor-parallel server, for a step of ``T`` new tokens (prefill and
decode) over ``S`` sampled sequences, ``C`` context tokens read (sum of every scheduled
sequence's cached + new tokens) and ``P`` causal query-key pairs per head::

    FLOPs = 2 x N x T / tp                        N: parameters outside the embeddings
                                                     (each weight: a multiply-add per token)
          + 2 x vocab x hidden x S / tp           the LM head, on each sampled position only
          + 4 x heads x head_dim x layers x P / tp    Q.K and P.V, a multiply-add each per pair and head dimension
    bytes = weights / tp                          every weight read once per step
          + C x KV bytes per token per rank       attention reads each sequence's K/V
          + T x KV bytes per token per rank       the new tokens' K/V written
          + T x layers x (6 x hidden + 3 x intermediate) x 2 / tp   activations (bf16) in and out of each layer
    link  = 2 x layers all-reduces of T x hidden x 2 bytes, a ring moving 2 (tp - 1) / tp of it per rank,
            each also paying ALLREDUCE_LATENCY_S

    step seconds = max(FLOPs / (peak x compute efficiency), bytes / (bandwidth x memory efficiency))
                   + link bytes / link bandwidth + 2 x layers x latency (tp > 1) + step overhead

The roofline is Williams, Waterman and Patterson, "Roofline", CACM 2009; the FLOP count per token is
Kaplan et al. 2020 ("Scaling Laws", 2N per token forward) plus attention. Peak is FP8's for 8-bit
weights (W8A8) where the GPU has FP8 tensor cores, else BF16's. Mixture-of-experts layers are
counted with every expert (an upper bound). Efficiencies and overhead: kvplan.plan.gpu_perf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.plan import dtypes, kv_math
from kvplan.plan.gpu_perf import GpuPerf, ServingFit
from kvplan.plan.model_spec import ModelSpec
from kvplan.plan.weights import count_parameters, weights_bytes

ALLREDUCE_LATENCY_S = 5e-6  # one small all-reduce between GPUs of a node (order of NCCL / custom all-reduce)
_ACTIVATION_BYTES = 2  # bf16


@dataclass(frozen=True)
class RooflineStepCost:
    """The model above for one model on one GPU type (a CostModel: ``step_seconds``, ``gap_s``).
    Per-rank counts: ``flops_per_token``, ``lm_head_flops``, ``attention_flops_per_pair``,
    ``weight_bytes``, ``kv_bytes_per_token``, ``activation_bytes_per_token``, ``link_bytes_per_token``."""

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
        return {
            "compute_s": flops / self.peak_flops,
            "memory_s": moved / self.hbm_bytes_per_s,
            "link_s": (
                self.link_bytes_per_token * tokens / self.link_bytes_per_s + self.num_allreduces * ALLREDUCE_LATENCY_S
            )
            if self.num_allreduces
            else 0.0,
        }

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
) -> RooflineStepCost:
    """The roofline of ``spec`` served on ``tp`` GPUs of type ``gpu`` (see the module docstring).

    Raises:
        KvplanError: a config without the sizes that count parameters, a bad tp or dtype.
    """
    embedding, other = count_parameters(spec)
    hidden, layers, vocab_size = spec.hidden_size, spec.num_layers, spec.vocab_size
    assert hidden is not None and vocab_size is not None  # count_parameters raised for a config without them
    kv_per_rank = kv_math.layers_bytes_per_token(kv_math.rank_layer_specs(spec, kv_cache_dtype, tp))
    weights = dtypes.canonical(weight_dtype, "weight_dtype")
    fp8_weights = weights == "fp8" or (weights == "auto" and spec.weight_bits == 8)
    peak = gpu.fp8_flops if fp8_weights and gpu.fp8_flops else gpu.bf16_flops
    return RooflineStepCost(
        flops_per_token=2 * other / tp,
        lm_head_flops=2 * vocab_size * hidden / tp,
        attention_flops_per_pair=4 * spec.num_attention_heads * spec.head_dim * layers / tp,
        weight_bytes=weights_bytes(spec, weight_dtype) / tp,
        kv_bytes_per_token=kv_per_rank,
        activation_bytes_per_token=layers
        * (6 * hidden + 3 * (spec.intermediate_size or 4 * hidden))
        * _ACTIVATION_BYTES
        / tp,
        link_bytes_per_token=2 * layers * hidden * _ACTIVATION_BYTES * 2 * (tp - 1) / tp if tp > 1 else 0.0,
        num_allreduces=2 * layers if tp > 1 else 0,
        peak_flops=peak,
        hbm_bytes_per_s=gpu.hbm_bytes_per_s,
        link_bytes_per_s=gpu.link_bytes_per_s,
        fit=fit,
    )
