"""``kvplan profile``: a request log's traffic profile, and a workload YAML that reproduces it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engine.config import DEFAULT_MODEL, TINY_RANDOM_MODEL
from kvplan.cli.app import make_console, warn


def _lazy_tokenizer(model: str):
    """``model``'s tokenizer (kvplan.traffic.tokenizer), built at its first call only: a Mooncake or
    kvplan log never loads one."""
    built: list = []

    def tokenize(texts: list[str]) -> list[list[int]]:
        if not built:
            from kvplan.errors import KvplanError
            from kvplan.traffic.tokenizer import tokenize_function

            function = tokenize_function(model)
            if function is None:
                raise KvplanError("tokenizer", f"{model} has no tokenizer", "give --tokenizer SmolLM2-135M-Instruct")
            built.append(function)
        return built[0](texts)

    return tokenize


def _check_model(model: str) -> None:
    """``--model`` as estimate and simulate check theirs (kvplan.sizing.models.model_source.load_model_spec: a
    preset or Hugging Face id, a config.json or its folder, a .gguf), or the engine's test model
    tiny-random-llama. Raises KvplanError (``model``: unknown, with the closest names)."""
    if model != TINY_RANDOM_MODEL:
        from kvplan.sizing.models.model_source import load_model_spec

        load_model_spec(model)


def _check_sharegpt(data: dict, out: Path, model: str) -> str | None:
    """kvplan.profile.sharegpt.check_sharegpt, drawing through the simulator's sample cache
    (the key ``kvplan simulate`` uses: the engine model's vocabulary and tokenizer), so simulating
    the written workload does not draw its ShareGPT prompts again."""
    from kvplan.profile.sharegpt import check_sharegpt
    from kvplan.run.sim.facts import model_config
    from kvplan.traffic.samples import cached_sample
    from kvplan.traffic.tokenizer import tokenize_function, tokenizer_identity

    vocab: list[int] = []

    def tokenizer():  # what cannot be built (a KvplanError) leaves the workload unchecked, not refused
        tokenize = tokenize_function(model)
        vocab.append(model_config(model).get("vocab_size") or 1)
        return tokenize

    def sample(workload, tokenize):
        return cached_sample(workload, lambda: tokenize, vocab[0], tokenizer_identity(model))

    return check_sharegpt(data, str(out), tokenizer, sample)


def profile(
    log: Annotated[
        Path,
        typer.Argument(
            help="A request log or trace: JSONL (OpenAI-style, a Mooncake trace, a kvplan requests.jsonl) or CSV"
            " (an Azure LLM inference trace, BurstGPT), or any CSV or JSONL read through --columns."
        ),
    ],
    log_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="The log's format: auto (a CSV's told by its header, a JSONL line's by its keys), openai, mooncake,"
            " kvplan, azure, burstgpt, mapped (--columns).",
        ),
    ] = "auto",
    columns: Annotated[
        str | None,
        typer.Option(
            help="Read any CSV or JSONL by its columns: FIELD=COLUMN,... with fields timestamp, input_tokens,"
            " output_tokens (required), session, latency, finish; e.g."
            " timestamp=TIME,input_tokens=ContextTokens,output_tokens=GeneratedTokens,session=conv."
        ),
    ] = None,
    time_unit: Annotated[
        str | None,
        typer.Option(help="With --columns: the unit of numeric times and latencies, s (default), ms or us."),
    ] = None,
    tokenizer: Annotated[
        str,
        typer.Option(help="An OpenAI log's tokenizer: SmolLM2-135M-Instruct or a folder with tokenizer.json."),
    ] = DEFAULT_MODEL,
    level: Annotated[
        str | None,
        typer.Option(
            help="A kvplan run's load level to profile, e.g. short/open/2 or short/closed/8/cached (default: the"
            " first in the file; all: every one)."
        ),
    ] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per block for the prefix reuse (engine default).")] = 16,
    out: Annotated[Path | None, typer.Option(help="Write a workload YAML reproducing the traffic here.")] = None,
    model: Annotated[
        str,
        typer.Option(
            help="The written workload's engine.model: a model kvplan knows (a preset, a config.json or its"
            " folder, a .gguf) or tiny-random-llama."
        ),
    ] = DEFAULT_MODEL,
    dataset: Annotated[
        str,
        typer.Option(
            help="The written workload's dataset: random (lengths drawn) or sharegpt (real prompts; refused when"
            " ShareGPT holds too few prompts for a length range)."
        ),
    ] = "random",
    num_requests: Annotated[
        int | None, typer.Option(help="The written workload's num_requests (default: the log's requests or sessions).")
    ] = None,
    plots: Annotated[
        Path | None,
        typer.Option(help="Write lengths.png, arrivals.png, prefix_reuse.png and load.png into this folder."),
    ] = None,
    replay: Annotated[
        bool,
        typer.Option(
            help="With --out: write the log itself as a Mooncake-format trace beside the workload, and a"
            " workload that replays it (dataset kind trace), instead of one that resembles it."
        ),
    ] = False,
    reuse_distance: Annotated[
        bool,
        typer.Option(
            help="Also report the reuse distance of the prefix blocks (LRU stack distance in tokens and seconds,"
            " P50/P90/P99) and the share of reuses an LRU cache of each size would hit (memory grows with the"
            " log's blocks)."
        ),
    ] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (its keys: docs/profile.md) instead of tables.")
    ] = False,
) -> None:
    """Profile a request log: length percentiles, prefix reuse, arrival rate and burstiness, turns, requests in flight; optionally write a workload that reproduces it."""  # noqa: E501
    from kvplan.errors import KvplanError
    from kvplan.profile.columns import parse_columns
    from kvplan.profile.csv_traces import FORMATS, read_trace
    from kvplan.profile.stats import profile_log
    from kvplan.profile.stream import profile_stream

    if log_format not in FORMATS:
        raise KvplanError("log_format", f"must be one of {', '.join(FORMATS)} (got {log_format!r})")
    if time_unit is not None and columns is None:
        problem = "is the unit of the times `columns` maps, and none was given"
        raise KvplanError("time_unit", problem, "give `columns` or no `time_unit`")
    if block_size < 1:
        raise KvplanError("block_size", f"must be >= 1 (got {block_size})")
    if dataset not in ("random", "sharegpt"):
        raise KvplanError("dataset", f"must be random or sharegpt (got {dataset!r})")
    if num_requests is not None and num_requests < 1:
        raise KvplanError("num_requests", f"must be >= 1 (got {num_requests})")
    _check_model(model)
    mapping = parse_columns(columns, time_unit) if columns is not None else None
    if replay and reuse_distance:
        raise KvplanError("reuse_distance", "reads the log as a stream, and --replay reads it whole", "drop one")
    if replay and out is None:
        raise KvplanError("replay", "writes a workload, and no --out was given", "give --out workload.yaml")
    if replay:  # the trace is written from every prompt's tokens: the log read whole (kvplan.profile.parsed)
        parsed = read_trace(log, log_format, _lazy_tokenizer(tokenizer), level, mapping)
        result = profile_log(parsed, block_size)
    else:  # read once, as a stream: memory bounded by the distinct prefix blocks (kvplan.profile.stream)
        result = profile_stream(log, log_format, _lazy_tokenizer(tokenizer), level, mapping, block_size, reuse_distance)
    written = None
    if out is not None:
        from kvplan.profile.workload import workload_from_profile, workload_name, write_workload

        if replay:
            from kvplan.profile.replay import replay_workload

            data = replay_workload(parsed, out, model=model, name=workload_name(log), block_size=block_size)
        else:
            data = workload_from_profile(
                result, model=model, dataset=dataset, name=workload_name(log), num_requests=num_requests
            )
            if dataset == "sharegpt":
                unchecked = _check_sharegpt(data, out, model)
                warn([unchecked] if unchecked else [], str(out))
        write_workload(data, out, str(log))
        written = str(out)
    warn(result.notes, str(log))
    if plots is not None:
        from kvplan.profile.plots import write_plots

        write_plots(result, plots)
    if json_output:
        import json

        print(json.dumps({"reuse_distance": None, **result.data, "workload": written}, indent=2))
        return
    from kvplan.profile.view import print_profile

    console = make_console()
    print_profile(result.data, console)
    if written is not None:
        console.print(f"workload: {written}", markup=False, highlight=False)
    if plots is not None:
        console.print(f"plots: {plots}", markup=False, highlight=False)
