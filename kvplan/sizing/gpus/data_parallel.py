"""Attention data parallelism (``dp``) of a GPU target: one engine instance on ``tp x dp`` GPUs.

The instance's attention runs ``dp`` independent batches: each DP rank (``tp`` GPUs) holds the
non-expert weights split ``tp`` ways, its own KV pool, and the sequences given to it; the routed
experts of a mixture-of-experts model are split over all ``tp x dp`` GPUs (``ep`` ways by
expert, ``tp x dp / ep`` ways within each expert). This is how aiconfigurator-core 0.12.0 prices
it (facts read in its source, ``sdk/config.py`` ``ModelConfig.resolve_moe_parallelism``:
``tp_size x attention_dp_size == moe_tp_size x moe_ep_size``; ``sdk/backends/base_backend.py``:
a step is evaluated at the per-rank batch ``bs`` and the instance serves ``global_bs = bs x
attention_dp_size``; ``sdk/operations/moe_comm.py``: the MoE operations scale the tokens by
``attention_dp_size``, attention DP gathering every rank's tokens through the all-to-all). Its
DeepSeek model prices every non-expert operation (attention, shared expert) at ``tp_size``, so
here every non-expert weight is a DP rank's, split ``tp`` ways.

Rules kvplan simulates with (one scheduler per instance, kvplan.run.sim.gpu_target):

- KV capacity: ``dp x`` one rank's pool, a rank's pool being its GPUs' memory x utilization -
  (non-expert weights / tp + routed-expert weights / (tp x dp)) - overhead (:func:`rank_weights_bytes`).
- Scheduler limits: the engine section's ``max_num_seqs`` and ``max_num_batched_tokens`` are
  each DP rank's (vLLM's data-parallel engine runs one scheduler per rank with its own limits),
  so the instance's are ``dp x`` them.
- Step time: the ranks step in lockstep (the experts' all-to-all joins them every MoE layer), so
  an instance step lasts as long as its slowest rank's: the rank with the most work when the
  step's decodes are spread as evenly as whole sequences allow and its prefill tokens as evenly
  as chunked prefill allows (:func:`busiest_rank`).
  The MoE operations of that rank's step see every rank's tokens (aiconfigurator's scaling by
  ``attention_dp_size`` above); the roofline prices the same (kvplan.sizing.gpus.step_cost, ``dp``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.errors import KvplanError
from kvplan.sizing.models.model_spec import ModelSpec
from kvplan.sizing.models.weights import routed_expert_parameters, weight_bytes_per_parameter, weights_bytes


def check_dp(spec: ModelSpec, tp: int, dp: int) -> None:
    """Whether ``spec`` can run attention data parallel ``dp`` on ``tp``-GPU ranks.

    Raises:
        KvplanError: ``dp`` below 1, or above 1 on a dense model (without experts to share, DP
            ranks are independent replicas: give more replicas or workers instead).
    """
    if dp < 1:
        raise KvplanError("dp", f"must be >= 1 (got {dp})", "give 1, or the DP ranks of each engine instance")
    if dp > 1 and (spec.moe is None or not spec.moe.moe_layers):
        raise KvplanError(
            "dp",
            f"{spec.name} has no experts for its {dp} DP ranks to share (got {dp})",
            "leave dp at 1 for a dense model: its DP ranks are replicas, give more replicas or workers",
        )


def routed_weights_bytes(spec: ModelSpec, weight_dtype: str = "auto") -> float:
    """Bytes of every routed expert of every MoE layer (0 for a dense model), as
    kvplan.sizing.models.weights counts them."""
    if spec.moe is None or not spec.moe.moe_layers:
        return 0.0
    per_param = weight_bytes_per_parameter(spec, weight_dtype)[1]
    return len(spec.moe.moe_layers) * spec.moe.num_experts * routed_expert_parameters(spec) * per_param


def rank_weights_bytes(spec: ModelSpec, weight_dtype: str, tp: int, dp: int) -> int:
    """Weight bytes on each GPU of a ``tp x dp`` instance: the non-expert weights / tp (each DP
    rank holds them all) + the routed experts / (tp x dp) (module docstring).

    Example: 100 GB of which 80 GB routed experts, tp 1 x dp 8: 20 + 80 / 8 = 30 GB per GPU.

    Raises:
        KvplanError: a config without the sizes that count parameters, an unknown weight dtype.
    """
    routed = routed_weights_bytes(spec, weight_dtype)
    return int((weights_bytes(spec, weight_dtype) - routed) / tp + routed / (tp * dp))


@dataclass(frozen=True)
class RankWork:
    """One DP rank's share of a step, with StepWork's counts (kvplan.run.sim.cost.StepWork)."""

    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_seqs: int
    num_context_tokens: int
    num_attended_tokens: int
    num_decode_context_tokens: int = 0


def busiest_rank(work: Any, dp: int) -> Any:
    """The share of ``work`` (StepWork's counts over the whole instance) of its busiest DP rank:
    ``ceil(n / dp)`` of the ``n`` decodes at their mean context, and of the ``P`` prefill tokens in
    ``m`` chunks, ``ceil(P / min(m, dp))`` in ``ceil(m / dp)`` chunks: one mean chunk where there
    are fewer chunks than ranks, else an even share, as each rank's own scheduler chunks its
    prompts to fill its own token budget (the instance's budget is ``dp`` x a rank's). Cached
    context and query-key pairs follow the tokens. ``dp`` 1 returns ``work`` itself.

    Example: 8 decodes over 4 ranks at 1,000 context tokens each: the rank prices 2 decodes and
    2,000 context tokens; 5 decodes over 4 ranks: 2 decodes (one rank gets two).
    """
    if dp == 1:
        return work
    n, m, p = work.num_decode_tokens, work.num_prefill_seqs, work.num_prefill_tokens
    rank_n, rank_m = -(-n // dp), -(-m // dp)
    rank_p = -(-p // min(m, dp)) if m else 0
    decode_context = work.num_decode_context_tokens
    if not decode_context and not p:
        decode_context = work.num_context_tokens
    prefill_context = work.num_context_tokens - decode_context
    decode_share = _share(decode_context, rank_n, n)
    return RankWork(
        num_prefill_tokens=rank_p,
        num_decode_tokens=rank_n,
        num_prefill_seqs=rank_m,
        num_context_tokens=decode_share + _share(prefill_context, rank_p, p),
        num_attended_tokens=_share(max(work.num_attended_tokens - decode_context, 0), rank_p, p) + decode_share,
        num_decode_context_tokens=decode_share,
    )


def _share(total: int, part: int, whole: int) -> int:
    """``total x part / whole`` rounded up (0 where ``whole`` is 0)."""
    return -(-total * part // whole) if whole else 0


class DataParallelStepCost:
    """A CostModel of a ``dp``-rank instance: each step lasts ``rank_cost``'s seconds for the
    busiest rank's share (:func:`busiest_rank`); ``rank_cost`` prices one rank with the MoE
    operations seeing every rank's tokens (aiconfigurator built with ``attention_dp_size``, or
    the roofline's ``dp``). ``gap_s`` is the rank's."""

    def __init__(self, rank_cost: Any, dp: int):
        self.rank_cost = rank_cost
        self.dp = dp
        self.gap_s = rank_cost.gap_s

    def step_seconds(self, work: Any) -> float:
        return self.rank_cost.step_seconds(busiest_rank(work, self.dp))

    def decode_seconds(self, n: int, contexts: Any) -> Any:
        """``step_seconds`` of decode-only steps of ``n`` decodes over each of ``contexts`` context
        tokens (numpy int64 [k]), float for float: the busiest rank's ``ceil(n / dp)`` decodes over
        its share of each context (``busiest_rank``), priced by ``rank_cost.decode_seconds`` (else
        step by step)."""
        import numpy as np

        rank_n = -(-n // self.dp)
        shares = -(-np.asarray(contexts, dtype=np.int64) * rank_n // n)
        fast = getattr(self.rank_cost, "decode_seconds", None)
        if fast is not None:
            return fast(rank_n, shares)
        return np.array([self.rank_cost.step_seconds(RankWork(0, rank_n, 0, c, c, c)) for c in shares.tolist()])


def check_ep(spec: ModelSpec, tp: int, ep: int, dp: int = 1) -> None:
    """Whether ``ep`` splits ``spec``'s experts within the instance's ``tp x dp`` GPUs (whatever
    times the steps).

    Raises:
        KvplanError: ``ep`` below 1, not dividing ``tp x dp``, above 1 on a dense model, or not
            dividing the model's routed experts (vLLM's expert parallelism gives each rank whole
            experts).
    """
    if ep > 1 and spec.moe is None:
        raise KvplanError("ep", f"{spec.name} has no experts to split (got {ep})", "leave ep at 1 for a dense model")
    width = tp * dp
    if ep < 1 or width % ep:
        named = f"tp x dp = {width}" if dp > 1 else f"tp = {tp}"
        raise KvplanError("ep", f"must divide {named} (got {ep})", "give 1 or a divisor of " + named.split(" =")[0])
    if ep > 1 and spec.moe is not None and spec.moe.num_experts % ep:
        raise KvplanError(
            "ep", f"must divide {spec.name}'s {spec.moe.num_experts} experts (got {ep})", "give a divisor of both"
        )
