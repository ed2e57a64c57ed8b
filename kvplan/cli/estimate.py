"""``kvplan estimate``: KV bytes per layer kind from a model's config, and what fits on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvplan.cli.app import make_console
from kvplan.errors import KvplanError
from kvplan.plan.capacity import DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_OVERHEAD_GIB


def _int_list(text: str | None, flag: str) -> tuple[int, ...]:
    """``"8192,32k,1M"`` -> (8192, 32768, 1048576): a ``k`` suffix means x1024 tokens, ``m``
    x1024**2, either case; None (option not given) -> ().

    Raises:
        KvplanError: an empty list, or an entry that is not a whole number (quoted as typed).
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
    return tuple(values)


def estimate(
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
) -> None:
    """KV bytes per token, per request and per batch, and what fits on a GPU (per GPU rank)."""
    from kvplan.plan.estimate import estimate as run_estimate
    from kvplan.plan.estimate_plot import check_plot_path
    from kvplan.plan.model_source import load_model_spec

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
        from kvplan.plan.estimate_plot import save_estimate_plot

        save_estimate_plot(result, plot)
    if json_output:
        import json

        print(json.dumps(result.to_dict(), indent=2))
    else:
        from kvplan.plan.estimate_view import render_estimate

        render_estimate(result, spec, make_console())
    if plot is not None:  # on stderr with --json, so that stdout stays one JSON object
        typer.echo(f"plot: {plot}", err=json_output)
