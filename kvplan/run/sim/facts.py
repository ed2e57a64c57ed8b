"""The facts of the engine a workload describes, worked out without building it (no torch, no weights).

A simulation needs what ``kvplan.run.bundled.backend.engine_facts`` reads off a built engine: the
model's dims (from the GGUF header, a folder's config.json, or ``engine.config.TINY_LLAMA``) and
the KV pool, sized as ``engine.kv_cache.KVCache`` and ``engine.llm_engine.LLMEngine`` size it::

    bytes_per_block = 2 (K and V) x num_layers x block_size x num_kv_heads x head_dim x KV element bytes
    num_blocks      = engine.num_blocks, or floor(kv_cache_memory / bytes_per_block) (default 256 MiB)
    max_model_len   = engine.max_model_len, or min(max_position_embeddings, num_blocks x block_size)
    offload tiers   = int(engine.offload.<tier>_gib x 2**30) // bytes_per_block blocks each

A test checks these against a built engine's facts, field by field.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from engine.config import DEFAULT_KV_CACHE_MEMORY_BYTES, DEFAULT_MODEL, TINY_LLAMA, TINY_RANDOM_MODEL
from kvplan.errors import KvplanError
from kvplan.results.run_result import EngineFacts, RunInfo
from kvplan.sizing.gpus.offload import tier_blocks
from kvplan.workload.schema import Workload

_ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def model_config(model: str) -> dict[str, Any]:
    """The Hugging Face config (a dict) of an engine model name.

    Raises:
        KvplanError: ``engine.model`` naming neither bundled model nor a folder with config.json.
    """
    if model == TINY_RANDOM_MODEL:
        return {"model_type": "llama", **TINY_LLAMA}
    if model == DEFAULT_MODEL:
        from kvplan.sizing.models.gguf_spec import read_gguf_config
        from kvplan.traffic.tokenizer import smollm2_gguf

        return read_gguf_config(smollm2_gguf())[0]
    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        raise KvplanError(
            "engine.model",
            f"{model!r} is neither {DEFAULT_MODEL}, {TINY_RANDOM_MODEL} nor a local "
            "Hugging Face folder with a config.json",
        )
    return json.loads(path.read_text())


def simulated_facts(workload: Workload, device: str, attention_backend: str) -> EngineFacts:
    """The EngineFacts a load test of ``workload`` would read off its engine; ``device`` and
    ``attention_backend`` name what the cost model stands for (``cpu``/``torch`` of a calibration,
    a GPU's name).

    Raises:
        KvplanError: ``engine.<field>`` as the engine names it: a max_model_len or block_size above
            the model's max_position_embeddings, or a KV budget below one block.
    """
    settings = workload.engine
    cfg = model_config(settings.model)
    max_pos = cfg.get("max_position_embeddings") or 2048
    dtype, kv = settings.model_dtype, settings.resolved_kv_cache_dtype
    layers, kv_heads = cfg["num_hidden_layers"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_block = 2 * layers * settings.block_size * kv_heads * head_dim * _ELEMENT_BYTES[kv]
    for field, value in (("max_model_len", settings.max_model_len), ("block_size", settings.block_size)):
        if value is not None and value > max_pos:
            raise KvplanError(
                f"engine.{field}",
                f"must be <= the model's max_position_embeddings {max_pos} (got {value})",
                source=workload.source,
            )
    num_blocks = settings.num_blocks
    if num_blocks is None:
        memory = int(settings.kv_cache_memory or DEFAULT_KV_CACHE_MEMORY_BYTES)
        num_blocks = memory // per_block
        if num_blocks < 1:
            raise KvplanError(
                "engine.kv_cache_memory",
                f"{memory:,} bytes hold not one block of {per_block:,} bytes",
                source=workload.source,
            )
    tiers = offload_blocks(workload, per_block)
    return EngineFacts(
        model=settings.model,
        device=device,
        dtype=dtype,
        kv_cache_dtype=kv,
        attention_backend=attention_backend,
        block_size=settings.block_size,
        num_blocks=num_blocks,
        bytes_per_block=per_block,
        max_model_len=settings.max_model_len or min(max_pos, num_blocks * settings.block_size),
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enable_prefix_caching=settings.enable_prefix_caching,
        seed=workload.seed,
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=cfg.get("vocab_size"),
        hf_config=cfg,
        **tiers,
    )


def offload_blocks(workload: Workload, bytes_per_block: int) -> dict[str, int]:
    """EngineFacts' ``offload_host_blocks`` and ``offload_disk_blocks`` of the workload's
    ``engine.offload`` on blocks of ``bytes_per_block`` bytes (kvplan.sizing.gpus.offload.tier_blocks,
    the engine's rule); {} with offload off.

    Raises:
        KvplanError: ``engine.offload.<tier>_gib`` below one block, or offload without
            ``engine.enable_prefix_caching`` (as the engine refuses them).
    """
    offload = workload.engine.offload
    if not offload.is_on:
        return {}
    if not workload.engine.enable_prefix_caching:
        raise KvplanError("engine.enable_prefix_caching", "offload tiers need it on", source=workload.source)
    blocks = {}
    for tier in ("host", "disk"):
        gib = getattr(offload, f"{tier}_gib")
        blocks[f"offload_{tier}_blocks"] = n = tier_blocks(gib, bytes_per_block)
        if gib is not None and n < 1:
            raise KvplanError(
                f"engine.offload.{tier}_gib",
                f"must hold at least one KV block of {bytes_per_block:,} bytes (got {gib} GiB)",
                source=workload.source,
            )
    return blocks


def simulated_run_info(dataset: dict[str, Any]) -> RunInfo:
    """Versions and machine of a simulation (no torch or transformers took part)."""
    import kvplan

    return RunInfo(
        kvplan_version=kvplan.__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        dataset=dataset,
    )
