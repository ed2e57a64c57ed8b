"""The views of ``kvplan plan`` (kvplan.optimize.plan): the ranked table, the best
configuration's ``vllm serve`` command, the Pareto chart, and a trace's windows (``--window``)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from kvplan.results.plan_result import ConfigResult, WindowPlan, WindowResult


def served_name(model: str) -> str:
    """The name ``vllm serve`` takes for ``model``: a preset's Hugging Face id, else as given."""
    from kvplan.errors import KvplanError
    from kvplan.sizing.models.model_source import load_preset

    try:
        return str(load_preset(model)[1]["hf_id"])
    except KvplanError:
        return model


def serve_command(model: str, r: ConfigResult) -> str:
    """The ``vllm serve`` line of configuration ``r`` (vLLM's flag names; 0.9 GPU memory, its
    default). fp8 weights are vLLM's online ``--quantization fp8``; another weight dtype needs a
    checkpoint quantised so, which the line says in a comment."""
    parts = [f"vllm serve {served_name(model)}", f"--tensor-parallel-size {r.tp}", f"--max-num-seqs {r.max_num_seqs}"]
    parts.append(f"--max-num-batched-tokens {r.max_num_batched_tokens}")
    if r.kv_cache_dtype not in ("auto", ""):
        parts.append(f"--kv-cache-dtype {r.kv_cache_dtype}")
    if r.weight_dtype == "fp8":
        parts.append("--quantization fp8")
    parts.append("--gpu-memory-utilization 0.9")
    if r.host_offload_gib:  # vLLM native CPU offloading, GiB (docs.vultr.com cookbook "KV Cache Offloading")
        parts.append(f"--kv-offloading-backend native --kv-offloading-size {r.host_offload_gib:g}")
    if r.weight_dtype not in ("auto", "", "fp8"):
        parts.append(f"  # a {r.weight_dtype} checkpoint of the model")
    return " ".join(parts)


def plan_frame(results: list[ConfigResult], load: dict, top: int = 15) -> pd.DataFrame:
    """The ``top`` best feasible configurations, ranked, as the console and summary.md show them."""
    per = "req/s / replica" if "rate" in load else "users / replica"
    rows = [
        {
            "#": i,
            "GPU": r.gpu,
            "tp": r.tp,
            "disagg": r.disagg or "",
            "kv": r.kv_cache_dtype,
            "weights": r.weight_dtype,
            "seqs": r.max_num_seqs,
            "tokens": r.max_num_batched_tokens,
            "host GiB": r.host_offload_gib or 0,
            per: r.slo_max_request_rate if "rate" in load else r.slo_max_concurrency,
            "replicas": r.replicas,
            "GPUs": r.num_gpus,
            "$/h": "unpriced" if r.usd_per_hour is None else f"{r.usd_per_hour:,.2f}",
            "$/1M out": None if r.usd_per_m_output_tokens is None else round(r.usd_per_m_output_tokens, 3),
            "$/1k good": None if r.usd_per_k_good_requests is None else round(r.usd_per_k_good_requests, 3),
            "step times": r.step_times,
            "meets SLO": "yes" if r.meets_slo else "no",
        }
        for i, r in enumerate([r for r in results if r.feasible][:top], 1)
    ]
    frame = pd.DataFrame(rows)
    if "disagg" in frame and set(frame["disagg"]) == {""}:
        frame = frame.drop(columns="disagg")  # aggregated replicas only
    if "host GiB" in frame and not frame["host GiB"].any():
        frame = frame.drop(columns="host GiB")  # no host KV tier asked
    if "weights" in frame and set(frame["weights"]) == {"auto"}:
        frame = frame.drop(columns="weights")  # one weight dtype asked: the checkpoint's
    return frame


def print_plan(
    results: list[ConfigResult],
    model: str,
    load: dict,
    console,
    top: int = 15,
    interrupted: tuple[int, int] | None = None,
) -> None:
    """The ``top`` best configurations, the count of the rest, and the best one's serve command;
    ``interrupted``: (configurations finished, in the grid) of a search Ctrl-C stopped."""
    from kvplan.results.report.tables import to_rich

    what = f"{load['rate']:g} req/s" if "rate" in load else f"{load['users']} users"
    table = to_rich(plan_frame(results, load, top), f"kvplan plan: {model} for {what}, cheapest first")
    console.print(table)
    infeasible = [r for r in results if not r.feasible]
    if infeasible:
        console.print(
            f"{len(infeasible)} configuration(s) infeasible, e.g. {infeasible[0].gpu} x{infeasible[0].tp}:"
            f" {infeasible[0].reason}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if interrupted is not None:
        console.print(
            f"interrupted: {interrupted[0]} of {interrupted[1]} configurations judged; the best is of those only",
            markup=False,
            highlight=False,
        )
    best = results[0] if results else None
    if best is not None and best.meets_slo:
        note = "" if best.usd_per_hour is not None else " (unpriced: ranked by GPU count)"
        line = serve_command(model, best)
        if best.disagg:  # the same engine settings per worker, each pool at its tp, joined by a KV connector
            tp = f"--tensor-parallel-size {best.tp}"
            line = f"{best.disagg}: each worker {line.replace(tp, '--tensor-parallel-size <its pool tp>')}"
        console.print(
            f"best{note}: {line}  # x{best.replicas} replica(s)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print("no configuration meets the SLO at this load", markup=False, highlight=False)


def plot_pareto(results: list[ConfigResult], tpot_ms: float | None, path) -> None:
    """Output tok/s per GPU against tok/s per user, every configuration meeting the SLO, the
    frontier (``pareto``) joined, the best labelled, and the SLO's TPOT as the
    per-user rate it allows (1,000 / TPOT ms); written to ``path`` (PNG).

    Raises:
        KvplanError: ``path`` cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvplan.errors import KvplanError

    met = [r for r in results if r.meets_slo and r.output_tokens_per_s_per_gpu is not None]
    fig, ax = plt.subplots(figsize=(8, 5))
    for gpu in dict.fromkeys(r.gpu for r in met):
        own = [r for r in met if r.gpu == gpu]
        per_user = [r.output_tokens_per_s_per_user or 0.0 for r in own]  # none is None: filtered above
        ax.scatter(per_user, [r.output_tokens_per_s_per_gpu or 0.0 for r in own], label=gpu)
    front = pareto(met)
    if front:
        ax.plot(
            [r.output_tokens_per_s_per_user or 0.0 for r in front],
            [r.output_tokens_per_s_per_gpu or 0.0 for r in front],
            "k--",
            lw=1,
            label="frontier",
        )
    if tpot_ms:
        ax.axvline(1000 / tpot_ms, color="tab:red", lw=1, label=f"TPOT SLO {tpot_ms:g} ms")
    if met:
        best = results[0]
        if best.meets_slo and best.output_tokens_per_s_per_user is not None:
            ax.annotate(
                f"best: {best.gpu} x{best.tp}",
                (best.output_tokens_per_s_per_user, best.output_tokens_per_s_per_gpu or 0),
            )
    ax.set_xlabel("output tok/s per user (at the most users within the SLO)")
    ax.set_ylabel("output tok/s per GPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as err:
        raise KvplanError("pareto", f"cannot write {path} ({err.strerror or err})") from None
    finally:
        plt.close(fig)


def pareto(results: Sequence[ConfigResult]) -> list[ConfigResult]:
    """The configurations no other beats on both output tok/s per GPU and per user (the frontier),
    by tok/s per user ascending; those without both numbers are left out."""
    points = [
        r for r in results if r.output_tokens_per_s_per_gpu is not None and r.output_tokens_per_s_per_user is not None
    ]
    front = [
        r
        for r in points
        if not any(
            o.output_tokens_per_s_per_gpu >= r.output_tokens_per_s_per_gpu  # type: ignore[operator]
            and o.output_tokens_per_s_per_user >= r.output_tokens_per_s_per_user  # type: ignore[operator]
            and (o.output_tokens_per_s_per_gpu, o.output_tokens_per_s_per_user)
            != (r.output_tokens_per_s_per_gpu, r.output_tokens_per_s_per_user)
            for o in points
        )
    ]
    return sorted(front, key=lambda r: r.output_tokens_per_s_per_user or 0.0)


def windows_frame(plan: WindowPlan) -> pd.DataFrame:
    """windows.csv: one row per window of ``kvplan plan --window`` (WindowResult's fields as columns)."""
    return pd.DataFrame([w.model_dump() for w in plan.windows], columns=list(WindowResult.model_fields))


def windows_lines(plan: WindowPlan) -> list[str]:
    """What the window sizing says: the configuration, the replica range, both costs and the saving."""
    unmet = [w.index for w in plan.windows if not w.meets_slo]
    hours = plan.window_s * len(plan.windows) / 3600
    lines = [
        f"{len(plan.windows)} window(s) of {plan.window_s:g} s ({hours:.3g} h) on {plan.gpu} x{plan.tp}:"
        f" {min((w.replicas or 0) for w in plan.windows)}-{max((w.replicas or 0) for w in plan.windows)}"
        f" replica(s) per window"
    ]
    if unmet:
        lines.append(f"window(s) {', '.join(map(str, unmet[:10]))} cannot meet the SLO on this configuration")
    elif plan.static_usd is None or plan.following_usd is None:
        lines.append(f"static: {plan.static_replicas} replica(s) all along (unpriced GPU: no cost)")
    else:
        change = plan.following_usd / plan.static_usd - 1 if plan.static_usd else 0.0
        lines += [
            f"static, sized for the busiest window: {plan.static_replicas} replica(s), ${plan.static_usd:,.2f}",
            f"following the windows (scale-up {plan.scale_up_s:g} s ahead): ${plan.following_usd:,.2f}"
            f" ({abs(change):.0%} {'less' if change <= 0 else 'more'} than static)",
        ]
    return lines


def print_windows(plan: WindowPlan, console) -> None:
    """The per-window table and ``windows_lines``."""
    from kvplan.results.report.tables import to_rich

    frame = windows_frame(plan)[["index", "start_s", "num_requests", "rate", "slo_max_request_rate", "replicas"]]
    console.print(to_rich(frame, "replicas per window"))
    for line in windows_lines(plan):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def plot_windows(plan: WindowPlan, path) -> None:
    """Required replicas per window (steps), the static deployment (sized for the busiest window)
    and the arrival rate (right axis) against hours from the trace's start; written to ``path`` (PNG).

    Raises:
        KvplanError: ``path`` cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from kvplan.errors import KvplanError

    end = plan.windows[-1].start_s + plan.window_s
    unit, per = ("hours", 3600.0) if end >= 7200 else ("seconds", 1.0)
    starts = [w.start_s / per for w in plan.windows] + [end / per]
    need = [w.replicas or 0 for w in plan.windows]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.stairs(need, starts, color="tab:blue", lw=2, label="required (following)")
    if plan.static_replicas is not None:
        ax.hlines(plan.static_replicas, starts[0], starts[-1], colors="tab:red", linestyles="--", label="static")
    ax.set_xlabel(f"{unit} from the trace's first arrival")
    ax.set_ylabel(f"replicas ({plan.gpu} x{plan.tp})")
    ax.set_ylim(0, max(need + [plan.static_replicas or 0]) + 1)
    rate = ax.twinx()
    rate.stairs([w.rate for w in plan.windows], starts, color="tab:gray", alpha=0.5, label="arrivals")
    rate.set_ylabel("arrivals, req/s")
    handles = ax.get_legend_handles_labels()[0] + rate.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as err:
        raise KvplanError("window", f"cannot write {path} ({err.strerror or err})") from None
    finally:
        plt.close(fig)
