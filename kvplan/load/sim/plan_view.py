"""The console view of ``kvplan plan`` (kvplan.load.sim.plan): the ranked table and the best
configuration's ``vllm serve`` command."""

from __future__ import annotations

from kvplan.load.sim.plan import ConfigResult


def serve_command(model: str, r: ConfigResult) -> str:
    """The ``vllm serve`` line of configuration ``r`` (vLLM's flag names; 0.9 GPU memory, its default)."""
    parts = [f"vllm serve {model}", f"--tensor-parallel-size {r.tp}", f"--max-num-seqs {r.max_num_seqs}"]
    parts.append(f"--max-num-batched-tokens {r.max_num_batched_tokens}")
    if r.kv_cache_dtype not in ("auto", ""):
        parts.append(f"--kv-cache-dtype {r.kv_cache_dtype}")
    parts.append("--gpu-memory-utilization 0.9")
    return " ".join(parts)


def _cell(value, digits: str = ".3g") -> str:
    return "" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:{digits}}"


def print_plan(results: list[ConfigResult], model: str, load: dict, console, top: int = 15) -> None:
    """The ``top`` best configurations, the count of the rest, and the best one's serve command."""
    from rich.table import Table

    what = f"{load['rate']:g} req/s" if "rate" in load else f"{load['users']} users"
    table = Table(title=f"kvplan plan: {model} for {what}, cheapest first", title_justify="left")
    for column in (
        "#",
        "GPU",
        "tp",
        "kv",
        "seqs",
        "tokens",
        "req/s / replica" if "rate" in load else "users / replica",
        "replicas",
        "GPUs",
        "$/h",
        "$/1M out",
        "$/1k good",
        "step times",
        "meets SLO",
    ):
        table.add_column(column, justify="left" if column in ("GPU", "kv", "step times", "meets SLO") else "right")
    shown = [r for r in results if r.feasible][:top]
    for i, r in enumerate(shown, 1):
        table.add_row(
            str(i),
            r.gpu,
            str(r.tp),
            r.kv_cache_dtype,
            str(r.max_num_seqs),
            str(r.max_num_batched_tokens),
            _cell(r.slo_max_request_rate if "rate" in load else r.slo_max_concurrency),
            _cell(r.replicas),
            _cell(r.num_gpus),
            _cell(r.usd_per_hour, ",.2f") or "unpriced",
            _cell(r.usd_per_m_output_tokens, ",.3f"),
            _cell(r.usd_per_k_good_requests, ",.3f"),
            r.step_times,
            "yes" if r.meets_slo else "no",
        )
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
    best = results[0]
    if best.meets_slo:
        note = "" if best.usd_per_hour is not None else " (unpriced: ranked by GPU count)"
        console.print(
            f"best{note}: {serve_command(model, best)}  # x{best.replicas} replica(s)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print("no configuration meets the SLO at this load", markup=False, highlight=False)


def plot_pareto(results: list[ConfigResult], tpot_ms: float | None, path) -> None:
    """Output tok/s per GPU against tok/s per user, every configuration meeting the SLO, the
    frontier (kvplan.load.sim.plan.pareto) joined, the best labelled, and the SLO's TPOT as the
    per-user rate it allows (1,000 / TPOT ms); written to ``path`` (PNG).

    Raises:
        KvplanError: ``path`` cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvplan.errors import KvplanError
    from kvplan.load.sim.plan import pareto

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
