"""GPU step times from measured silicon: aiconfigurator-core's per-operation database as a cost model.

aiconfigurator-core (NVIDIA, Apache-2.0, the ``silicon`` extra) ships latencies measured on real
GPUs for every operation of a transformer step (GEMMs, context and generation attention, MoE,
all-reduce, embedding, norms) under vLLM, SGLang and TensorRT-LLM versions, and a compiled
evaluator that prices a list of those operations at a given shape. ``SiliconStepCost`` asks it for
each step the scheduler actually scheduled (kvplan.run.sim.cost.StepWork), never for an average::

    decode-only step (n decodes, D context tokens):  generation ops at batch n, context D / n
    step with prefill (P prefill tokens over m chunks, T = P + n tokens in all):
        every non-attention op at T tokens (the LM head at the n + m sampled positions)
      + context attention of m chunks of P / m new tokens over (C - D - P) / m cached ones
      + generation attention of the n decodes at context D / n
    step seconds = scale x (the sum, ms) / 1000 + step overhead + layer overhead x layers
                   + sequence overhead x (n + m)
                   (scale: the decode scale on a decode-only step, the prefill scale otherwise)

The composition mirrors aiconfigurator's own mixed step (``Engine::mixed_step_latency``: shared
non-attention ops, context attention, decode attention), fed with the step's own counts. The
two scales and three overheads per backend (what the kernels alone leave out: the serving loop, the
gaps between each layer's kernel launches, sampling, detokenising and streaming) are fitted on measured
H100 serving runs (bench/silicon_check.py, ``data/silicon_fit.yaml``). Each distinct shape is asked once:
the shapes are rounded to 1/128 of an octave above 128 (at most 0.8 % off) and the answers memoised (on
disk too: kvplan.sizing.gpus.silicon_memo), so a step costs microseconds after the first few.

Coverage: a GPU whose speed table entry names a ``silicon_system`` with a database for the
backend, and a model whose config has the shape of one of aiconfigurator's bundled model configs
(matched on architecture and sizes, so a kvplan preset, a local config.json or a GGUF finds it).
``silicon_cost`` returns the reason when a target is not covered; the caller falls back to the
roofline (kvplan.sizing.gpus.step_cost) and says so.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.sizing import dtypes
from kvplan.sizing.gpus.silicon_db import available, database_versions, default_version, nvlink_domain, quiet
from kvplan.sizing.gpus.silicon_marlin import MOE_KERNELS, take_marlin_experts
from kvplan.sizing.gpus.silicon_memo import LazyHandle, StepMemo
from kvplan.sizing.gpus.silicon_models import bundled_configs, match_model, mla_modes, quant_method, quant_modes
from kvplan.sizing.gpus.silicon_spec import engine_handle, memo_file, warm_up

BACKENDS = ("vllm", "sglang", "trtllm")
SILICON_KV_DTYPES = ("auto", "bf16", "fp16", "fp8")  # the KV cache modes its databases measure
FIT_FILE = Path(__file__).parents[1] / "data" / "silicon_fit.yaml"
INSTALL_HINT = "pip install 'kvplan[silicon]'"
_EXACT_BELOW = 128  # shapes up to this are asked exactly; above, rounded to 7 significant bits


@dataclass(frozen=True)
class SiliconFit:
    """A backend's correction of the summed operation times: ``decode_scale`` and
    ``prefill_scale`` (factors on decode-only steps and on steps with prefill), ``step_overhead_s``
    (the serving loop's fixed cost per step: scheduling, input preparation), ``seq_overhead_s``
    (its cost per scheduled sequence per step: sampling, detokenising and streaming each new
    token) and ``layer_overhead_s`` (its cost per model layer per step: the gaps between the
    layer's kernels, which the per-kernel measurements leave out), all in seconds."""

    decode_scale: float = 1.0
    prefill_scale: float = 1.0
    step_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0
    fitted_on: str = ""


@dataclass(frozen=True)
class SiliconSource:
    """Which measured data times the steps: aiconfigurator ``system``, ``backend`` and its
    database ``version``, and the bundled model config (``model_path``) matched."""

    system: str
    backend: str
    version: str
    model_path: str

    @property
    def label(self) -> str:
        """As the report and JSON name it: ``silicon: h100_sxm / vllm 0.24.0``."""
        return f"silicon: {self.system} / {self.backend} {self.version}"


def check_backend(backend: str) -> str:
    """``backend`` lower-cased, if it is one aiconfigurator's database has.

    Raises:
        KvplanError: ``backend``: an unknown name (the message lists the known ones).
    """
    name = backend.strip().lower()
    if name not in BACKENDS:
        raise KvplanError("backend", f"unknown backend {backend!r}", f"use one of {', '.join(BACKENDS)}")
    return name


def silicon_cost(
    config: dict[str, Any],
    system: str | None,
    tp: int,
    backend: str = "vllm",
    version: str | None = None,
    weight_dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    ep: int = 1,
    fit: SiliconFit | None = None,
    dp: int = 1,
    moe_kernel: str = "auto",
) -> SiliconStepCost | str:
    """The silicon cost model of ``config`` on ``tp`` GPUs of aiconfigurator system ``system``
    under ``backend`` (``version``: its database version, default the newest), experts split
    ``ep`` ways (MoE: expert parallel ``ep`` x expert tensor parallel ``tp x dp / ep``); or, where the
    database does not cover the target, a one-line reason. ``dp`` > 1: one attention-DP rank of a
    ``tp x dp``-GPU instance, priced as aiconfigurator prices it (``attention_dp_size``: the MoE
    operations see every rank's tokens; kvplan.sizing.gpus.data_parallel), for the rank's own work.
    ``moe_kernel``: ``auto`` (the database's own expert kernel) or ``marlin`` (MXFP4 experts on
    Marlin's W4A16 kernels, as vLLM's ``VLLM_MXFP4_USE_MARLIN=1`` runs them: priced from the
    database's Marlin MXFP4 rows by kvplan.sizing.gpus.silicon_marlin's rule).

    Raises:
        KvplanError: an unknown ``backend``; a ``backend_version`` that is empty, or that the
            database lacks for this system (the message lists those it has), or given for a GPU
            it holds no ``backend`` data for; ``ep`` not dividing ``tp x dp``; an unknown
            ``moe_kernel``, or ``marlin`` for a model without MXFP4 experts.
    """
    backend = check_backend(backend)
    if moe_kernel not in MOE_KERNELS:
        raise KvplanError("moe_kernel", f"unknown MoE kernel {moe_kernel!r}", f"use one of {', '.join(MOE_KERNELS)}")
    if ep < 1 or (tp * dp) % ep:
        width = f"tp x dp = {tp * dp}" if dp > 1 else f"tp = {tp}"
        raise KvplanError("ep", f"must divide {width} (got {ep})", "give 1 or a divisor of tp" + " x dp" * (dp > 1))
    if version is not None and not version.strip():
        raise KvplanError("backend_version", "is empty", "give a database version, or leave it out")
    if not available():
        return f"aiconfigurator-core is not installed ({INSTALL_HINT})"
    versions = database_versions(system, backend) if system is not None else []
    if version is not None and not versions:  # a version named for a GPU the database does not hold
        raise KvplanError(
            "backend_version",
            f"aiconfigurator-core has no {backend} data for this GPU (got {version})",
            "leave it out: the roofline times this GPU",
        )
    if system is None:
        return "no aiconfigurator system for this GPU"
    if not versions:
        return f"no {backend} data for {system} in aiconfigurator-core's database"
    if version is None:
        version = default_version(system, backend) or versions[-1]
    elif version not in versions:
        raise KvplanError(
            "backend_version",
            f"aiconfigurator-core has no {backend} {version} data for {system}",
            f"use one of {', '.join(versions)}, or leave it out for its current one",
        )
    domain = nvlink_domain(system)
    if domain and tp * dp > domain:
        return f"its data covers tp{' x dp' * (dp > 1)} up to {domain} (one NVLink domain of {system})"
    kv = dtypes.canonical(kv_cache_dtype, "kv_cache_dtype")
    if kv not in SILICON_KV_DTYPES:
        return f"its database has no {kv} KV cache (it has {', '.join(SILICON_KV_DTYPES[1:])})"
    model_path = match_model(config, weight_dtype)
    if model_path is None:
        return "no aiconfigurator model config has this model's shape"
    source = SiliconSource(system, backend, version, model_path)
    try:
        handle, context_ops, generation_ops, experts, memo = _engine(
            source,
            tp,
            ep,
            dp,
            tuple(
                sorted(
                    (
                        quant_modes(weight_dtype, kv_cache_dtype, quant_method(bundled_configs()[model_path]))
                        | mla_modes(bundled_configs()[model_path])
                    ).items()
                )
            ),
            moe_kernel,
        )
    except KvplanError:
        raise
    except Exception as err:  # the database lacks this shape or precision: the roofline covers it
        return f"aiconfigurator-core cannot price it ({type(err).__name__}: {_short(str(err))})"
    layers = int(config.get("num_hidden_layers") or 0)
    fit = fit or silicon_fit(backend)
    return SiliconStepCost(source, handle, context_ops, generation_ops, fit, layers, experts, memo)


class SiliconStepCost:
    """A CostModel (kvplan.run.sim.cost): ``step_seconds(work)`` per the module docstring, from
    an aiconfigurator compiled engine ``handle`` and the positions of its ``context_ops`` and
    ``generation_ops`` by role (``non_attention``, ``attention``, ``logits``), for a model of
    ``num_layers`` layers (what the fit's layer overhead multiplies). ``experts``: a
    kvplan.sizing.gpus.silicon_marlin.MarlinExperts pricing the MoE experts at a step's tokens in
    place of the database's own MoE operation (left out of the ops), or None. ``gap_s`` is 0: the
    serving loop's own cost is the fitted step overhead. ``memo``: (kind, *shape) -> ms (before the
    fit: the handle's alone), shared by every cost model on one ``_engine`` in a process."""

    gap_s = 0.0

    def __init__(
        self,
        source: SiliconSource,
        handle: Any,
        context_ops: dict[str, list[int]],
        generation_ops: dict[str, list[int]],
        fit: SiliconFit,
        num_layers: int = 0,
        experts: Any = None,
        memo: dict[tuple, float] | None = None,
    ):
        self.source = source
        self.fit = fit
        self.num_layers = num_layers
        self._fixed_s = fit.step_overhead_s + fit.layer_overhead_s * num_layers
        self._handle = handle
        self._ctx = context_ops
        self._gen = generation_ops
        self._experts, self._experts_ms = experts, (experts.ms if experts is not None else lambda tokens: 0.0)
        self._memo: dict[tuple, float] = {} if memo is None else memo
        self._decode_s, self._prefill_s = fit.decode_scale / 1e3, fit.prefill_scale / 1e3

    def step_seconds(self, work: Any) -> float:
        n = work.num_decode_tokens
        prefill = work.num_prefill_tokens
        decode_context = work.num_decode_context_tokens or (work.num_context_tokens if not prefill else n)
        fit = self.fit
        if not prefill:
            ms = self._ms("decode", _q(n), _q(-(-decode_context // max(n, 1)))) if n else 0.0
            return ms * self._decode_s + self._fixed_s + fit.seq_overhead_s * n
        m = max(work.num_prefill_seqs, 1)
        cached = max(work.num_context_tokens - decode_context - prefill, 0)
        ms = self._ms("shared", _q(prefill + n), _q(n + m)) + self._ms(
            "context_attention", m, _q(-(-prefill // m)), _q(cached // m)
        )
        if n:
            ms += self._ms("decode_attention", _q(n), _q(-(-decode_context // n)))
        return ms * self._prefill_s + self._fixed_s + fit.seq_overhead_s * (n + m)

    def decode_seconds(self, n: int, contexts: Any) -> Any:
        """``step_seconds`` of decode-only steps of ``n`` decodes over each of ``contexts`` context
        tokens (numpy int64 [k]), float for float: seconds [k]. Each distinct rounded shape is
        asked once, as ``step_seconds`` asks it (a run's context per decode grows by one a step, so
        a few shapes cover thousands of steps)."""
        import numpy as np

        shapes = _q_array(-(-np.asarray(contexts, dtype=np.int64) // max(n, 1)))
        distinct, where = np.unique(shapes, return_inverse=True)
        batch = _q(n)
        ms = np.array([self._ms("decode", batch, int(s)) for s in distinct.tolist()], dtype=np.float64)[where]
        return ms * self._decode_s + self._fixed_s + self.fit.seq_overhead_s * n

    def _ms(self, kind: str, *shape: int) -> float:
        key = (kind, *shape)
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self._ask(kind, *shape)
        return value

    def _ask(self, kind: str, *shape: int) -> float:
        h, ctx, gen = self._handle, self._ctx, self._gen
        if kind == "decode":  # aiconfigurator's decode step: every generation op at this batch and context
            batch, context = shape
            ops = gen["non_attention"] + gen["logits"] + gen["attention"]
            return _sum(h.evaluate_generation_ops(ops, batch_size=batch, s=context)) + self._experts_ms(batch)
        if kind == "decode_attention":
            batch, context = shape
            return (
                _sum(h.evaluate_generation_ops(gen["attention"], batch_size=batch, s=context))
                if gen["attention"]
                else 0.0
            )
        if kind == "shared":  # non-attention ops at T tokens; the LM head at the sampled positions
            tokens, sampled = shape
            total = _sum(h.evaluate_context_ops(ctx["non_attention"], batch_size=1, s=tokens, x=tokens))
            total += self._experts_ms(tokens)
            if ctx["logits"]:
                total += _sum(h.evaluate_generation_ops(gen["logits"], batch_size=sampled, s=1))
            return total
        chunks, new, cached = shape  # context attention: s = new tokens per chunk, prefix = cached ones
        return _sum(h.evaluate_context_ops(ctx["attention"], batch_size=chunks, s=new, prefix=cached))


def silicon_fit(backend: str) -> SiliconFit:
    """The fitted correction of ``backend`` from ``data/silicon_fit.yaml`` (none: scales 1, no
    overheads)."""
    entry = _fits().get(backend)
    if not entry:
        return SiliconFit()
    return SiliconFit(
        decode_scale=float(entry["decode_scale"]),
        prefill_scale=float(entry["prefill_scale"]),
        step_overhead_s=float(entry["step_overhead_ms"]) / 1e3,
        seq_overhead_s=float(entry["seq_overhead_ms"]) / 1e3,
        layer_overhead_s=float(entry.get("layer_overhead_ms", 0.0)) / 1e3,
        fitted_on=str(entry.get("fitted_on", "")),
    )


@cache
def _fits() -> dict[str, Any]:
    from kvplan.yaml_input import load_data

    if not FIT_FILE.is_file():
        return {}
    return (load_data(FIT_FILE.read_text()) or {}).get("backends", {})


def _q(x: int) -> int:
    """``x`` exactly up to 128, else kept to its 7 leading bits (rounded to the nearest): within
    0.8 % of ``x`` (2**-7)."""
    if x <= _EXACT_BELOW:
        return x
    shift = x.bit_length() - 7
    return ((x + (1 << (shift - 1))) >> shift) << shift


def _q_array(x: Any) -> Any:
    """``_q`` of every element of ``x`` (numpy int64, each in [1, 2**53)): the same integers."""
    import numpy as np

    x = np.asarray(x, dtype=np.int64)
    bits = np.frexp(x.astype(np.float64))[1].astype(np.int64)  # x = m x 2**bits, m in [0.5, 1): bit_length
    shift = np.maximum(bits - 7, 1)
    return np.where(x <= _EXACT_BELOW, x, ((x + np.left_shift(1, shift - 1)) >> shift) << shift)


def _short(message: str, limit: int = 120) -> str:
    """The first line of an aiconfigurator error without its file paths, cut at a word within
    ``limit`` characters (with an ellipsis when cut)."""
    line = re.sub(r"\s+at\s+/[^;\s]*", "", (message.splitlines() or [""])[0]).strip()
    line = line.removeprefix("perf database error: ")
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0].rstrip(",;:(") + " ..."


def _sum(entries: list[tuple]) -> float:
    return sum(e[1] for e in entries)


@cache
def _engine(
    source: SiliconSource, tp: int, ep: int, dp: int, modes_items: Any, moe_kernel: str = "auto"
) -> tuple[Any, dict, dict, Any, dict[tuple, float]]:
    """A target's engine, its ops by role, Marlin experts (or None) and shared memo, once a process
    (the memo kept on disk where the engine is: kvplan.sizing.gpus.silicon_memo)."""
    return _build_engine(source, tp, ep, dict(modes_items), dp, moe_kernel)


def _build_engine(
    source: SiliconSource, tp: int, ep: int, modes: dict[str, str], dp: int = 1, moe_kernel: str = "auto"
) -> tuple[Any, dict, dict, Any, StepMemo]:
    from aiconfigurator_core.sdk import common, config
    from aiconfigurator_core.sdk.models import get_model

    enums = {
        "gemm_quant_mode": common.GEMMQuantMode,
        "moe_quant_mode": common.MoEQuantMode,
        "kvcache_quant_mode": common.KVCacheQuantMode,
        "fmha_quant_mode": common.FMHAQuantMode,
    }
    quant: dict[str, Any] = {k: enums[k][v] for k, v in modes.items()}
    with quiet():
        model_config = config.ModelConfig(
            tp_size=tp, attention_dp_size=dp, moe_tp_size=tp * dp // ep, moe_ep_size=ep, **quant
        )
        model = get_model(source.model_path, model_config, source.backend)
        # kept on disk across processes (Marlin's experts read the model's ops as the build leaves them)
        identity = {**asdict(source), "tp": tp, "ep": ep, "dp": dp, "modes": modes} if moe_kernel != "marlin" else None
        memo = StepMemo(memo_file(identity) if identity is not None else None)
        context, generation = _roles(model.context_ops), _roles(model.generation_ops)
        build = lambda: engine_handle(model, source.system, source.backend, source.version, identity)  # noqa: E731
        if memo.kept:  # a shape it lacks builds the engine then, warmed up (its tables loaded side by side)
            return LazyHandle(build, lambda h: warm_up(h, context, generation)), context, generation, None, memo
        handle = build()
        experts = take_marlin_experts(source, model, context, generation) if moe_kernel == "marlin" else None
        warm_up(handle, context, generation)  # a shape or precision the data lacks fails here, not mid-run
    return handle, context, generation, experts, memo


def _roles(ops: list[Any]) -> dict[str, list[int]]:
    """Positions of a phase's operations by role: attention (context/generation attention, MLA
    blocks), the LM head (``logits``), and the rest."""
    roles: dict[str, list[int]] = {"attention": [], "logits": [], "non_attention": []}
    for i, op in enumerate(ops):
        name = str(getattr(op, "_name", "")).lower()
        kind = type(op).__name__.lower()
        if "logits" in name:
            roles["logits"].append(i)
        elif "attention" in kind or "attention" in name or "mla" in name or "mla" in kind:
            roles["attention"].append(i)
        else:
            roles["non_attention"].append(i)
    return roles
