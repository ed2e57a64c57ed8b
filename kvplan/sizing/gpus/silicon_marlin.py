"""MXFP4 experts on Marlin's W4A16 kernels, priced from aiconfigurator-core's measured Marlin rows
carried to the model's expert shape (for kvplan.sizing.gpus.silicon).

vLLM runs an MXFP4 MoE (gpt-oss) on Hopper with the OpenAI Triton kernel unless
``VLLM_MXFP4_USE_MARLIN=1`` selects Marlin's W4A16 kernels (the InferenceX H100 gpt-oss recipes
set it: github SemiAnalysisAI/InferenceX, ``benchmarks/gptoss_fp4_h100_slurm.sh`` at 2e46dba0 and
``benchmarks/single_node/gptoss_fp4_h100.sh`` at 34bc7c40). aiconfigurator-core 0.12.0 times
gpt-oss's experts with the Triton kernel only; its vLLM 0.24.0 ``moe_perf`` table holds Marlin
MXFP4 experts at one other shape (Kimi-K3: hidden 3,584, expert FFN 3,072, top-16 of 896 experts,
``kernel_source`` ``vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts_situ_as_silu``).

The rule that carries a measured shape (ref) to the model's (m), per MoE layer on one GPU::

    tokens per expert  u = T x topk / experts        (the M of each expert's GEMMs)
    expert weights     W = experts x hidden x inter / (moe_tp x moe_ep)
    fixed time         f_ref: the intercept of the reference's 1-token times against
                       1 / moe_tp (least squares over its moe_ep 1 rows, moe_tp 1-16: the
                       weights one token reads split moe_tp ways, the rest does not);
                       f_m = f_ref x topk_m / topk_ref
    t_m(T) = f_m + (t_ref(T x (topk_m / E_m) / (topk_ref / E_ref)) - f_ref) x W_m / W_ref

At equal tokens per expert both shapes touch the same share of their experts with GEMMs of the
same M, so their FLOPs and their weight bytes both scale by ``W``: one ratio covers the compute-
and the memory-bound regime. What does not scale with the weights is the fixed time of the
kernels' launches and routing; Marlin's is per expert slot of a token (topk): 3.7 us a slot in
the Marlin MXFP4 rows (60 us at top-16) and 4.5 us in the Marlin INT4 rows (36 us at top-8).
``t_ref`` is interpolated linearly in log tokens and log time between the measured token counts
(1 to 16,384), at the same ``moe_tp``, ``moe_ep`` and token distribution; past the largest, the
time grows with the tokens.

Checked on the database itself (bench/silicon_check.py has no part in it), power_law_1.2 rows,
moe_tp 1-8: carrying vLLM's Marlin INT4 rows (Kimi-K2: 7,168 / 2,048, top-8 of 384,
``vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts``) to the Marlin MXFP4 shape is within
a median 3.0-7.2 % of the measured times, and the reverse within 3.3-7.0 %; carrying the Triton
kernel's gpt-oss rows between 32 and 128 experts (weights x4), 3.9-12.9 %, where scaling the
fixed time with the weights too misses by 10-73 %. gpt-oss-120b's weights are 1/9.3 of the
Marlin MXFP4 shape's, a longer carry than these checks cover.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from functools import cache
from typing import Any

from kvplan.errors import KvplanError

MARLIN_MXFP4 = "vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts"  # prefix of its kernel_source
MOE_KERNELS = ("auto", "marlin")


class MarlinExperts:
    """Per-layer times (ms) of a MoE layer's experts on Marlin MXFP4 kernels for ``tokens`` tokens
    on one GPU, by the module docstring's rule, from the measured ``curve`` ((tokens, ms) pairs of
    the reference shape, tokens ascending), the two shapes' ``ratio`` (topk / experts of the
    model over the reference's) and ``weights`` (W_m / W_ref), the reference's fixed time
    ``fixed_ref`` and the model's ``fixed`` (ms per layer), for ``layers`` layers."""

    def __init__(
        self,
        curve: list[tuple[int, float]],
        ratio: float,
        weights: float,
        layers: float,
        fixed_ref: float = 0.0,
        fixed: float = 0.0,
    ):
        self._tokens = [math.log(t) for t, _ in curve]
        self._ms = [math.log(ms) for _, ms in curve]
        self._last = curve[-1]
        self.ratio, self.weights, self.layers = ratio, weights, layers
        self.fixed_ref, self.fixed = fixed_ref, fixed

    def ms(self, tokens: int) -> float:
        """All ``layers`` MoE layers' expert time (ms) at ``tokens`` tokens (0 for none)."""
        if tokens <= 0:
            return 0.0
        ref = tokens * self.ratio
        top_tokens, top_ms = self._last
        if ref >= top_tokens:
            per_layer = top_ms * ref / top_tokens
        else:
            x = math.log(max(ref, math.exp(self._tokens[0])))
            i = min(max(bisect_left(self._tokens, x), 1), len(self._tokens) - 1)
            x0, x1, y0, y1 = self._tokens[i - 1], self._tokens[i], self._ms[i - 1], self._ms[i]
            per_layer = math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))
        return (self.fixed + max(per_layer - self.fixed_ref, 0.0) * self.weights) * self.layers


def take_marlin_experts(source: Any, model: Any, context: dict, generation: dict) -> MarlinExperts:
    """Take the MXFP4 MoE operation out of both phases' op roles (``context`` / ``generation``:
    positions by role, kvplan.sizing.gpus.silicon._roles) of aiconfigurator ``model`` and return
    its Marlin pricing from ``source``'s (a SiliconSource) database.

    Raises:
        KvplanError: ``moe_kernel``: the model has no MXFP4 MoE operation, or the database no
            Marlin MXFP4 rows at its expert parallel shape."""
    found = {}
    phases = (("context", model.context_ops, context), ("generation", model.generation_ops, generation))
    for phase, ops, roles in phases:
        moe = [i for i in roles["non_attention"] if type(ops[i]).__name__ == "MoE"]
        if len(moe) != 1 or "mxfp4" not in str(ops[moe[0]]._quant_mode):
            raise KvplanError("moe_kernel", "marlin prices MXFP4 experts, which this model has not", "use auto")
        roles["non_attention"].remove(moe[0])
        found[phase] = ops[moe[0]]
    experts = marlin_experts(source.system, source.backend, source.version, found["context"])
    if isinstance(experts, str):
        raise KvplanError("moe_kernel", experts, "use auto")
    return experts


def marlin_experts(system: str, backend: str, version: str, op: Any) -> MarlinExperts | str:
    """The Marlin MXFP4 pricing of aiconfigurator MoE operation ``op`` (its hidden, inter, topk,
    experts, moe_tp, moe_ep, token distribution and layer count, ``_scale_factor``) from the
    ``system`` / ``backend`` / ``version`` database, or a one-line reason where the database has no
    Marlin MXFP4 rows at its moe_tp, moe_ep and distribution."""
    tp, ep, dist = int(op._moe_tp_size), int(op._moe_ep_size), str(op._workload_distribution)
    found = _reference(system, backend, version, tp, ep, dist)
    if isinstance(found, str):
        return found
    (hidden, inter, topk, experts), curve, fixed_ref = found
    ratio = (op._topk / op._num_experts) / (topk / experts)
    weights = (op._num_experts * op._hidden_size * op._inter_size) / (experts * hidden * inter)
    fixed = fixed_ref * op._topk / topk
    return MarlinExperts(curve, ratio, weights, float(op._scale_factor), fixed_ref, fixed)


@cache
def _reference(system: str, backend: str, version: str, tp: int, ep: int, dist: str) -> Any:
    """((hidden, inter, topk, experts), [(tokens, ms), ...], fixed ms) of the database's Marlin
    MXFP4 rows at this moe_tp, moe_ep and distribution (the fixed time: the module docstring's
    f_ref), or the reason there are none."""
    from importlib.resources import files

    import pandas as pd

    path = files("aiconfigurator_core") / "systems" / "data" / system / "moe" / backend / version / "moe_perf.parquet"
    try:
        table = pd.read_parquet(str(path))
    except (OSError, ValueError) as err:
        return f"no moe_perf table for {system} / {backend} {version} ({type(err).__name__})"
    marlin = table[
        table["kernel_source"].astype(str).str.startswith(MARLIN_MXFP4)
        & (table["moe_dtype"] == "w4a16_mxfp4")
        & (table["distribution"] == dist)
    ]
    rows = marlin[(marlin["moe_tp_size"] == tp) & (marlin["moe_ep_size"] == ep)]
    shapes = rows.groupby(["hidden_size", "inter_size", "topk", "num_experts"]).size()
    if rows.empty:
        return f"no Marlin MXFP4 expert times in {system} / {backend} {version} at moe_tp {tp}, moe_ep {ep}, {dist}"
    shape = tuple(int(v) for v in shapes.idxmax())
    one = rows[(rows[["hidden_size", "inter_size", "topk", "num_experts"]] == list(shape)).all(axis=1)]
    curve = sorted(one.groupby("num_tokens")["latency"].median().items())
    same = marlin[(marlin[["hidden_size", "inter_size", "topk", "num_experts"]] == list(shape)).all(axis=1)]
    single = same[(same["num_tokens"] == 1) & (same["moe_ep_size"] == 1)]
    return shape, [(int(t), float(ms)) for t, ms in curve], fixed_time(single["moe_tp_size"], single["latency"])


def fixed_time(moe_tp: Any, latency: Any) -> float:
    """The intercept ``f`` (ms) of ``latency = f + c / moe_tp`` by least squares over the 1-token
    rows given (0 where fewer than two moe_tp values)."""
    import numpy as np

    x = 1.0 / np.asarray(moe_tp, dtype=float)
    y = np.asarray(latency, dtype=float)
    if len(set(x.tolist())) < 2:
        return 0.0
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept)
