"""Element dtypes of KV caches and weights: one name table for all of kvplan.

Canonical names are ``fp32, fp16, bf16, fp8, int8, int4``; torch's and Hugging Face's spellings
(``bfloat16``, ``torch.float8_e4m3fn``, ...) are aliases of them, so a workload's engine section,
its plan entries, the CLI and results.json all use one vocabulary. Weights may also be stored in
the block-scaled 4-bit floating point formats ``nvfp4`` (alias ``fp4``) and ``mxfp4``
(:data:`FP4_WEIGHT_DTYPES`; :data:`WEIGHT_DTYPES` lists every weight dtype), which are not KV dtypes.

``auto`` has one meaning everywhere: *the dtype the model runs in*. For a planned deployment that
is vLLM's ``--dtype auto`` ("FP16 precision for FP32 and FP16 models, BF16 for BF16 models",
vLLM engine arguments): :func:`serving_dtype`. For the bundled engine it is the engine's own
dtype, which the engine resolves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.errors import KvplanError


@dataclass(frozen=True)
class KVDtype:
    """How one element is stored.

    ``element_bits``: bits per element. Grouped integer formats (``group_size`` > 0) add
    ``group_scale_bytes`` per group of ``group_size`` consecutive elements of one token's K (or V)
    row; the layouts are llama.cpp's ``q8_0`` (32 x int8 + one fp16 scale = 34 bytes) and ``q4_0``
    (32 x 4 bits + one fp16 scale = 18 bytes), from ggml's block definitions. fp8 (e4m3) keeps one
    scale per layer tensor, as vLLM does, which costs nothing per token.
    """

    name: str
    element_bits: int
    group_size: int = 0
    group_scale_bytes: int = 0

    def row_bytes(self, num_elements: int) -> int:
        """Bytes for one token's row of ``num_elements`` K (or V) values, scales included."""
        if self.group_size:
            num_groups = math.ceil(num_elements / self.group_size)
            return num_groups * (self.group_size * self.element_bits // 8 + self.group_scale_bytes)
        return num_elements * self.element_bits // 8

    @property
    def bytes_per_element(self) -> float:
        """Bytes of one element, group scales left out (weights: bits / 8)."""
        return self.element_bits / 8


DTYPES: dict[str, KVDtype] = {
    "fp32": KVDtype("fp32", 32),
    "fp16": KVDtype("fp16", 16),
    "bf16": KVDtype("bf16", 16),
    "fp8": KVDtype("fp8", 8),
    "int8": KVDtype("int8", 8, group_size=32, group_scale_bytes=2),
    "int4": KVDtype("int4", 4, group_size=32, group_scale_bytes=2),
}


@dataclass(frozen=True)
class BlockScaledDtype:
    """A weight format of ``element_bits``-bit values in blocks of ``block_size`` consecutive
    values sharing one ``scale_bits``-bit scale."""

    name: str
    element_bits: int
    block_size: int
    scale_bits: int

    @property
    def bits_per_weight(self) -> float:
        """Bits of one weight, its share of the block scale included."""
        return self.element_bits + self.scale_bits / self.block_size

    @property
    def bytes_per_element(self) -> float:
        """Bytes of one weight, its share of the block scale included."""
        return self.bits_per_weight / 8


# 4-bit floating point weights: E2M1 values (1 sign, 2 exponent, 1 mantissa bit) with a block scale.
# mxfp4: one E8M0 (power of two) scale per 32 values = 4 + 8 / 32 = 4.25 bits per weight (OCP
#   Microscaling Formats (MX) Specification v1.0, 2023, its concrete format MXFP4: k = 32, E8M0 scale).
# nvfp4: one FP8 E4M3 scale per 16 values = 4 + 8 / 16 = 4.5 bits per weight (NVIDIA, "Introducing
#   NVFP4 for Efficient and Accurate Low-Precision Inference", developer.nvidia.com/blog, 2025,
#   table 1); its per-tensor FP32 second-level scale, a few bytes per tensor, is left out.
FP4_WEIGHT_DTYPES: dict[str, BlockScaledDtype] = {
    "nvfp4": BlockScaledDtype("nvfp4", 4, block_size=16, scale_bits=8),
    "mxfp4": BlockScaledDtype("mxfp4", 4, block_size=32, scale_bits=8),
}
# every weight dtype's canonical name (the KV dtypes, then the FP4 weight formats)
WEIGHT_DTYPES: tuple[str, ...] = (*DTYPES, *FP4_WEIGHT_DTYPES)
# torch and Hugging Face spellings (config.json's torch_dtype, str(torch.dtype)) -> canonical names
ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",  # vLLM's --kv-cache-dtype names both FP8 formats; one byte each
    "float8_e5m2": "fp8",
    "float8": "fp8",
    "fp4": "nvfp4",  # weights only
}
# checkpoint dtypes a config.json may name (torch_dtype / dtype)
CHECKPOINT_DTYPES = ("float32", "float16", "bfloat16")


def canonical(name: str, field: str = "kv_cache_dtype", allowed: tuple[str, ...] = tuple(DTYPES)) -> str:
    """The canonical name of ``name`` (any case, ``torch.`` prefix allowed); ``auto`` stays ``auto``.

    Raises:
        KvplanError: naming ``field``, when the name is not one of ``allowed`` (or an alias of one).
    """
    key = str(name).strip().lower().removeprefix("torch.")
    key = ALIASES.get(key, key)
    if key == "auto" or key in allowed:
        return key
    raise KvplanError(field, f"unknown dtype {name!r}", f"use one of {', '.join(['auto', *allowed])}")


def canonical_weight(name: str, field: str = "weight_dtype") -> str:
    """The canonical name of weight dtype ``name``: :func:`canonical` over :data:`WEIGHT_DTYPES`.

    Raises:
        KvplanError: naming ``field``, when the name is not a weight dtype (or an alias of one).
    """
    return canonical(name, field, WEIGHT_DTYPES)


def weight_bytes_per_element(name: str) -> float:
    """Bytes of one weight stored as ``name`` (a canonical weight dtype, not ``auto``): the FP4
    formats' block scales are counted (4.25 and 4.5 bits), the grouped int8/int4 formats' are not
    (bits / 8, as before).

    Raises:
        KeyError: ``name`` is not one of :data:`WEIGHT_DTYPES`.
    """
    fp4 = FP4_WEIGHT_DTYPES.get(name)
    return fp4.bytes_per_element if fp4 is not None else DTYPES[name].bytes_per_element


def serving_dtype(checkpoint_dtype: str) -> str:
    """What vLLM's ``--dtype auto`` serves a checkpoint in: its own dtype, except fp32 -> fp16."""
    name = ALIASES.get(checkpoint_dtype, checkpoint_dtype)
    return "fp16" if name == "fp32" else name if name in DTYPES else "bf16"


def resolve(name: str, model_dtype: str, field: str = "kv_cache_dtype") -> KVDtype:
    """The dtype ``name`` stands for; ``auto`` is ``model_dtype``, the dtype the model runs in
    (for a checkpoint: :func:`serving_dtype` of its dtype).

    Raises:
        KvplanError: an unknown name (see :func:`canonical`).
    """
    key = canonical(name, field)
    return DTYPES[canonical(model_dtype, field) if key == "auto" else key]
