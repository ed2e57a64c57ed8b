"""Which of aiconfigurator-core's bundled models a kvplan model is, and its precision in
aiconfigurator's quant-mode names (for kvplan.sizing.gpus.silicon).

A model is matched on its config's shape, not its name: the same architecture and equal sizes
wherever both configs give one (hidden size, layers, heads, KV heads, FFN and expert sizes,
vocabulary), so a kvplan preset, a local config.json or a GGUF header all find it.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from kvplan.sizing import dtypes

# the config keys a model's shape is matched on (a key absent from either side is not compared)
_SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "head_dim",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_intermediate_size",
    "num_experts_per_tok",
    "kv_lora_rank",
)
_REQUIRED_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def match_model(config: dict[str, Any], weight_dtype: str = "auto") -> str | None:
    """The aiconfigurator model id (``meta-llama/Meta-Llama-3.1-8B``) whose bundled config has the
    shape of ``config`` (same architecture; equal sizes wherever both give one), None where none
    does. Among several (a model and its FP8 checkpoint), the one whose quantisation matches
    ``weight_dtype`` (fp8 -> an FP8 checkpoint; bf16/fp16 -> an unquantised one; auto -> as
    ``config`` itself is quantised)."""
    if any(config.get(k) is None for k in _REQUIRED_KEYS):
        return None
    arch = (config.get("architectures") or [None])[0]
    matches = [
        (path, bundled)
        for path, bundled in bundled_configs().items()
        if (bundled.get("architectures") or [None])[0] == arch
        and all(config.get(k) == bundled.get(k) for k in _SHAPE_KEYS if k in config and k in bundled)
    ]
    if not matches:
        return None
    want = dtypes.canonical_weight(weight_dtype)
    wanted_method = quant_method(config) if want == "auto" else ("fp8" if want == "fp8" else None)

    def rank(item: tuple[str, dict]) -> tuple[bool, str]:
        return (quant_method(item[1]) != wanted_method, item[0])

    return min(matches, key=rank)[0]


def quant_method(config: dict[str, Any]) -> str | None:
    quant = config.get("quantization_config") or {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return str(method).lower() if method else None


def quant_modes(weight_dtype: str, kv_cache_dtype: str, checkpoint: str | None = None) -> dict[str, str]:
    """aiconfigurator's quant-mode names for kvplan's dtype choices. ``auto``, and a weight dtype
    the matched checkpoint already has (``checkpoint``: its ``quant_method``, e.g. fp8 or mxfp4),
    leave the checkpoint's own modes, as aiconfigurator reads them from the bundled config (an
    FP8 checkpoint's may be block-scaled). aiconfigurator-core 0.12.0 has no MXFP4 GEMM mode, so
    ``mxfp4``'s dense GEMMs are priced as ``nvfp4``, its nearest 4-bit float GEMM, and its experts
    as ``w4a16_mxfp4``; a GPU without FP4 tensor cores (H100) then names nvfp4 in its reason."""
    weights = dtypes.canonical_weight(weight_dtype)
    if checkpoint is not None and weights == checkpoint:
        weights = "auto"
    kv = dtypes.canonical(kv_cache_dtype, "kv_cache_dtype")
    modes: dict[str, str] = {}
    if weights in ("bf16", "fp16"):
        modes["gemm_quant_mode"] = modes["moe_quant_mode"] = "bfloat16"
    elif weights in ("fp8", "int8", "int4", "nvfp4", "mxfp4"):
        modes["gemm_quant_mode"] = {
            "fp8": "fp8",
            "int8": "int8_wo",
            "int4": "int4_wo",
            "nvfp4": "nvfp4",
            "mxfp4": "nvfp4",
        }[weights]
        modes["moe_quant_mode"] = {
            "fp8": "fp8",
            "int8": "fp8",
            "int4": "int4_wo",
            "nvfp4": "nvfp4",
            "mxfp4": "w4a16_mxfp4",
        }[weights]
    if kv in ("bf16", "fp16"):
        modes["kvcache_quant_mode"] = "bfloat16"
    elif kv == "fp8":
        modes["kvcache_quant_mode"] = "fp8"
    return modes


def mla_modes(config: dict[str, Any]) -> dict[str, str]:
    """The attention precision to name for an MLA model (a bundled ``config`` with
    ``kv_lora_rank``; {} for others): ``bfloat16``. aiconfigurator-core 0.12.0 infers FP8 attention
    for an FP8 checkpoint such as DeepSeek-V3/R1, but its MLA tables hold only ``mla_dtype``
    bfloat16 rows for context on every backend (the b200_sxm and h200_sxm ``mla`` parquet files of
    sglang 0.5.14, trtllm 1.3.0rc20 and vllm 0.24.0, read 2026-12-05), so without it every MLA
    step fails with "context MLA data missing" and the roofline prices the model instead."""
    return {"fmha_quant_mode": "bfloat16"} if config.get("kv_lora_rank") else {}


@cache
def bundled_configs() -> dict[str, dict[str, Any]]:
    """aiconfigurator-core's bundled model configs by model id (file ``org--name_config.json``),
    of the models it reads offline (``sdk.common.DefaultHFModels``): for any other id, even one
    whose config file ships (Mixtral, Kimi-K2 in 0.12.0), it downloads the config from
    HuggingFace, and kvplan stays offline."""
    from importlib.resources import files

    from aiconfigurator_core.sdk.common import DefaultHFModels

    folder = files("aiconfigurator_core") / "model_configs"
    out = {}
    for entry in folder.iterdir():
        name = entry.name
        if not name.endswith("_config.json") or name.endswith("_hf_quant_config.json"):
            continue
        if name[: -len("_config.json")].replace("--", "/", 1) not in DefaultHFModels:
            continue
        try:
            data = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            data = data.get("text_config", data) if "hidden_size" not in data else data
            out[name[: -len("_config.json")].replace("--", "/", 1)] = data
    return out
