"""``kvplan estimate``: KV bytes per layer kind from a model's config, and what fits on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvplan.cli.app import make_console, typed_options
from kvplan.errors import KvplanError
from kvplan.sizing.capacity import DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_OVERHEAD_GIB

_NO_BUDGET = "llama.cpp's KV buffer is sized in cells, not from a GPU budget: give `ctx_size` and `parallel`"
_CONTEXT = "give `ctx_size`, llama.cpp's context of all slots together, instead"
_WHOLE_BUFFER = "llama.cpp's estimate is its whole KV buffer, however llama-server splits it across GPUs: leave it out"
# vLLM-only option -> what `kvplan estimate --engine llama.cpp` takes instead (the fix when one is given)
_LLAMACPP_INSTEAD = {
    "gpu": _NO_BUDGET,
    "gpu_memory_gib": _NO_BUDGET,
    "gpu_memory_utilization": _NO_BUDGET,
    "kv_memory_gib": _NO_BUDGET,
    "weights_gib": _NO_BUDGET,
    "weight_dtype": _NO_BUDGET,
    "overhead_gib": _NO_BUDGET,
    "kv_cache_dtype": "give `cache_type_k` and `cache_type_v`, llama.cpp's K and V types, instead",
    "tp": _WHOLE_BUFFER,
    "pp": _WHOLE_BUFFER,
    "block_size": "llama.cpp has no KV blocks (one cell per token): give `ctx_size` instead",
    "max_model_len": _CONTEXT,
    "context": _CONTEXT,
    "batch": "give `parallel`, llama.cpp's slots, instead",
    "shared_prefix_tokens": "llama.cpp's buffer holds `ctx_size` cells whatever the prompts share: leave it out",
    "plot": "the llama.cpp estimate draws no plot (--json prints its numbers): leave it out",
}


# --context and --batch make a grid, every context x every batch: 100 x 100 took 1.5 s, 1,000 x
# 1,000 over 60 s and 20,000 x 20,000 no end in sight; 256 x 256 7.7 s (2026-12-06, shared 2-core Xeon)
MAX_LIST = 128  # 128 x 128: a few seconds


def _int_list(text: str | None, flag: str) -> tuple[int, ...]:
    """``"8192,32k,1M"`` -> (8192, 32768, 1048576): a ``k`` suffix means x1024 tokens, ``m``
    x1024**2, either case; None (option not given) -> ().

    Raises:
        KvplanError: an empty list, an entry that is not a whole number (quoted as typed), or over
            ``MAX_LIST`` entries.
    """
    if text is None:
        return ()
    example = "1,8,32" if flag == "--batch" else "8192,32k,128k"
    if not text.strip():
        raise KvplanError(flag, "the list is empty", f"give numbers like {example}, or leave the option out")
    values = []
    for part in (part.strip() for part in text.split(",")):
        scale = {"k": 2**10, "m": 2**20}.get(part[-1:].lower(), 1)
        try:
            values.append(int(part[:-1] if scale > 1 else part) * scale)
        except ValueError:
            raise KvplanError(flag, f"{part!r} is not a whole number", f"give numbers like {example}") from None
    if len(values) > MAX_LIST:
        raise KvplanError(
            flag,
            f"{len(values):,} values, over the {MAX_LIST} one table takes (every context x every batch)",
            f"give at most {MAX_LIST}, e.g. {example}",
        )
    return tuple(values)


def estimate(
    ctx: typer.Context,
    model: Annotated[
        str,
        typer.Option(
            help="Preset name or Hugging Face id (case-insensitive), config.json path or folder, or .gguf file."
        ),
    ],
    gpu: Annotated[
        str | None,
        typer.Option(
            help="GPU from the bundled table, by exact name or alias (H100-SXM, H100-PCIe, H100-NVL, H20, H200,"
            " GH200, B200, A100-80GB, L40S, MI300X, MI325X, RTX-4090, ...); an unknown name lists the closest."
        ),
    ] = None,
    gpu_memory_gib: Annotated[float | None, typer.Option(help="GPU memory in GiB, instead of --gpu.")] = None,
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option(
            help=f"Fraction of GPU memory the server may use (default {DEFAULT_GPU_MEMORY_UTILIZATION}, vLLM's)."
        ),
    ] = None,
    kv_memory_gib: Annotated[
        float | None,
        typer.Option(
            help="KV pool size in GiB per GPU, as vLLM prints it, instead of the budget arithmetic (then no"
            " --weights-gib, --overhead-gib or --gpu-memory-utilization)."
        ),
    ] = None,
    weights_gib: Annotated[
        float | None, typer.Option(help="Weight memory per GPU in GiB, instead of parameters counted from the config.")
    ] = None,
    weight_dtype: Annotated[
        str,
        typer.Option(
            help="Weight dtype: auto (checkpoint dtype or quantization), fp32, fp16, bf16, fp8, int8, int4,"
            " nvfp4 (alias fp4), mxfp4."
        ),
    ] = "auto",
    overhead_gib: Annotated[
        float | None,
        typer.Option(
            help="Non-KV reserve per GPU in GiB: activation peak, CUDA context, graphs"
            f" (default {DEFAULT_OVERHEAD_GIB}; vLLM logs show 1-3 GiB)."
        ),
    ] = None,
    kv_cache_dtype: Annotated[
        str, typer.Option(help="KV dtype: auto (model dtype), fp32, fp16, bf16, fp8, int8, int4.")
    ] = "auto",
    tp: Annotated[int, typer.Option(help="Tensor-parallel size.")] = 1,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel size.")] = 1,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = DEFAULT_BLOCK_SIZE,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            help="Longest request in tokens, at most the model's limit (default: that limit, its"
            " max_position_embeddings)."
        ),
    ] = None,
    context: Annotated[
        str | None,
        typer.Option(help="Context lengths for the grid, e.g. 8192,32k,1m (k = 1024 tokens; default: max_model_len)."),
    ] = None,
    batch: Annotated[str, typer.Option(help="Batch sizes for the grid, e.g. 1,8,32.")] = "1",
    shared_prefix_tokens: Annotated[
        int, typer.Option(help="Tokens of a prefix every request shares; its full blocks count once per batch.")
    ] = 0,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG of KV GiB against context per batch size, with the KV budget.")
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="Whose KV layout: vllm (paged blocks, the GPU budget) or llama.cpp (llama-server's one KV"
            " buffer of --ctx-size cells shared by --parallel slots)."
        ),
    ] = "vllm",
    ctx_size: Annotated[
        int | None, typer.Option(help="llama.cpp: -c, the context in tokens of all slots (default: the model's).")
    ] = None,
    parallel: Annotated[
        int | None, typer.Option(help="llama.cpp: -np, the slots (default: auto, 4 slots with a unified KV).")
    ] = None,
    cache_type_k: Annotated[
        str, typer.Option(help="llama.cpp: -ctk: f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0, iq4_nl.")
    ] = "f16",
    cache_type_v: Annotated[str, typer.Option(help="llama.cpp: -ctv, the same types as --cache-type-k.")] = "f16",
    kv_unified: Annotated[
        bool | None,
        typer.Option(
            "--kv-unified/--no-kv-unified",
            help="llama.cpp: one KV stream shared by every slot (default: only when --parallel is auto).",
        ),
    ] = None,
    swa_full: Annotated[bool, typer.Option(help="llama.cpp: full-size cache for sliding-window layers.")] = False,
    ubatch_size: Annotated[
        int, typer.Option(help="llama.cpp: -ub, the physical batch, which sizes the sliding-window cache.")
    ] = 512,
) -> None:
    """KV bytes per token, per request and per batch, and what fits on a GPU (per GPU rank); or
    llama.cpp's KV buffer (--engine llama.cpp)."""
    from kvplan.sizing.estimate import estimate as run_estimate
    from kvplan.sizing.estimate_plot import check_plot_path
    from kvplan.sizing.models.model_source import load_model_spec

    llamacpp_settings = {
        "ctx_size": ctx_size,
        "parallel": parallel,
        "cache_type_k": cache_type_k,
        "cache_type_v": cache_type_v,
        "kv_unified": kv_unified,
        "swa_full": swa_full,
        "ubatch_size": ubatch_size,
    }
    if engine.lower() in ("llama.cpp", "llamacpp"):
        given = typed_options(ctx, _LLAMACPP_INSTEAD)
        if given:  # typed at its default value too: a silently ignored flag would mislead
            raise KvplanError(given[0], "does not apply to --engine llama.cpp", _LLAMACPP_INSTEAD[given[0]])
        _llamacpp_estimate(model, llamacpp_settings, json_output)
        return
    if engine.lower() != "vllm":
        raise KvplanError("engine", f"unknown engine {engine!r}", "use vllm or llama.cpp")
    given = typed_options(ctx, llamacpp_settings)
    if given:
        raise KvplanError(given[0], "applies to --engine llama.cpp only", "add --engine llama.cpp")
    if plot is not None:
        check_plot_path(plot)  # before the work, so a bad path costs nothing
    spec = load_model_spec(model)
    result = run_estimate(
        spec,
        contexts=_int_list(context, "--context"),
        batch_sizes=_int_list(batch, "--batch"),
        shared_prefix_tokens=shared_prefix_tokens,
        kv_cache_dtype=kv_cache_dtype,
        tp=tp,
        pp=pp,
        block_size=block_size,
        max_model_len=max_model_len,
        gpu=gpu,
        gpu_memory_gib=gpu_memory_gib,
        gpu_memory_utilization=gpu_memory_utilization,
        weights_gib=weights_gib,
        weight_dtype=weight_dtype,
        overhead_gib=overhead_gib,
        kv_memory_gib=kv_memory_gib,
    )
    if plot is not None:
        from kvplan.sizing.estimate_plot import save_estimate_plot

        save_estimate_plot(result, plot)
    if json_output:
        import json

        print(json.dumps(result.to_dict(), indent=2))
    else:
        from kvplan.sizing.estimate_view import render_estimate

        render_estimate(result, spec, make_console())
    if plot is not None:  # on stderr with --json, so that stdout stays one JSON object
        typer.echo(f"plot: {plot}", err=json_output)


def _llamacpp_estimate(model: str, settings: dict, json_output: bool) -> None:
    """``kvplan estimate --engine llama.cpp``: the flags checked first, then llama.cpp's KV buffer."""
    from kvplan.sizing.llamacpp import SWA_MODEL_TYPES, LlamaCppSettings, check_settings, ggml_type, llamacpp_kv
    from kvplan.sizing.models.model_source import load_model_config, load_model_spec

    parsed = LlamaCppSettings(**settings)
    check_settings(parsed)  # bad flags cost no model read
    ggml_type(parsed.cache_type_k, "cache_type_k")
    ggml_type(parsed.cache_type_v, "cache_type_v")
    source = load_model_config(model)
    # a GGUF names a sliding window only where its architecture reads one; a Hugging Face config
    # may name one that llama.cpp's architecture for it ignores (Mistral)
    is_gguf = source.path is not None and source.path.suffix.lower() == ".gguf"
    sliding = is_gguf or str(source.config.get("model_type", "")) in SWA_MODEL_TYPES
    result = llamacpp_kv(load_model_spec(model), parsed, sliding)
    if json_output:
        import json

        print(json.dumps(result.to_dict(), indent=2))
    else:
        from kvplan.sizing.llamacpp_view import render_llamacpp

        render_llamacpp(result, make_console())
