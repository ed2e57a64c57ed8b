"""``kvplan plan``'s run folder, which ``kvplan report DIR`` re-renders::

    plan.json     the search (kvplan.results.plan_result.PlanRun): the ``--json`` object, whose keys
                  are a contract, plus what was asked and whether Ctrl-C cut it short
    summary.md    the ranked table, the infeasible ones with their reasons, the best ``vllm serve``
    configs.csv   every configuration evaluated, one row each (the ``configs`` keys as columns)
    pareto.png    output tok/s per GPU against per user (kvplan.results.report.plan_view.plot_pareto)
    windows.csv   with --window: replicas per window of the trace (plan_view.windows_frame)
    windows.png   with --window: required replicas per window, the static deployment, the arrivals

Every file is written atomically (kvplan.results.store.write_atomic); summary.md, configs.csv
and pareto.png are views, rebuilt from plan.json alone.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvplan.results.plan_result import PLAN_FILE, ConfigResult, PlanRun, read_plan
from kvplan.results.store import write_atomic


def configs_frame(run: PlanRun) -> pd.DataFrame:
    """Every configuration evaluated, ranked, one row each (ConfigResult's fields as columns)."""
    columns = list(ConfigResult.model_fields)
    return pd.DataFrame([c.model_dump() for c in run.configs], columns=columns)


def summary_markdown(run: PlanRun) -> str:
    """summary.md: what was asked, the ranked table, the infeasible count, the best command."""
    from kvplan.results.report.plan_view import plan_frame, serve_command
    from kvplan.results.report.tables import to_markdown

    what = f"{run.load['rate']:g} req/s" if "rate" in run.load else f"{run.load['users']} users"
    slo = ", ".join(
        f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in run.slo.items() if isinstance(v, int | float)
    )
    lines = [
        f"# kvplan plan: {run.model} for {what}",
        "",
        f"Workload {run.workload}, bucket {run.bucket}; SLO {slo or 'none'} at {run.attainment:.0%} attainment;"
        f" {len(run.configs)} of {run.num_configs} configurations evaluated"
        + (" (interrupted: the rest were not run)" if run.interrupted else "")
        + f"; {run.created}.",
        "",
        to_markdown(plan_frame(run.configs, run.load, top=len(run.configs))).rstrip("\n"),
    ]
    infeasible = [r for r in run.configs if not r.feasible]
    if infeasible:
        lines += ["", f"## Infeasible ({len(infeasible)})", ""]
        lines += [
            f"- {r.gpu} {r.disagg or f'x{r.tp}'} kv {r.kv_cache_dtype} weights {r.weight_dtype}: {r.reason}"
            for r in infeasible
        ]
    best = run.best
    lines += ["", "## Best", ""]
    if best is None:
        lines.append("No configuration meets the SLO at this load.")
    else:
        note = "" if best.usd_per_hour is not None else " (unpriced: ranked by GPU count)"
        unit = f" of {best.disagg}, each worker at its pool's tp and limits" if best.disagg else ""
        lines += [f"{best.replicas} replica(s){unit}{note}:", "", "```bash", serve_command(run.model, best), "```"]
    if run.disagg_verdict:
        lines += ["", "## Disaggregation", "", run.disagg_verdict]
    if run.offload_verdict:
        lines += ["", "## Host offload", "", run.offload_verdict]
    if run.windows is not None:
        from kvplan.results.report.plan_view import windows_frame, windows_lines

        lines += [
            "",
            "## Windows",
            "",
            "The busiest window's load ranks the grid above; the best is sized on every window:",
            "",
        ]
        lines += [f"- {line}" for line in windows_lines(run.windows)]
        lines += ["", to_markdown(windows_frame(run.windows)).rstrip("\n")]
    return "\n".join(lines) + "\n"


def write_plan(run_dir: Path, run: PlanRun) -> None:
    """plan.json, then its views (``render_plan``).

    Raises:
        KvplanError: a file cannot be written.
    """
    write_atomic(run_dir / PLAN_FILE, run.model_dump_json(indent=2) + "\n")
    render_plan(run_dir, run)


def render_plan(run_dir: Path, run: PlanRun | None = None) -> PlanRun:
    """Rebuild summary.md, configs.csv and pareto.png from plan.json (or ``run``); returns the run.

    Raises:
        KvplanError: plan.json unreadable (``read_plan``), or a view cannot be written.
    """
    from kvplan.results.report.plan_view import plot_pareto

    run = run if run is not None else read_plan(run_dir)
    write_atomic(run_dir / "summary.md", summary_markdown(run))
    write_atomic(run_dir / "configs.csv", configs_frame(run).to_csv(index=False))
    plot_pareto(run.configs, run.slo.get("tpot_ms"), run_dir / "pareto.png")
    if run.windows is not None:
        from kvplan.results.report.plan_view import plot_windows, windows_frame

        write_atomic(run_dir / "windows.csv", windows_frame(run.windows).to_csv(index=False))
        plot_windows(run.windows, run_dir / "windows.png")
    return run
