"""The console view of ``kvplan advise`` (kvplan.optimize.advise): one table, then one line per alternative."""

from __future__ import annotations

from kvplan.optimize.advise import Advice

_ORDER = {"baseline": 0, "worth it": 1, "within noise": 2, "not worth it": 3, "cannot run": 4}


def _cell(value: float | int | None, digits: str = ".3g") -> str:
    return "" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:{digits}}"


def print_advice(advice: Advice, console) -> None:
    """The alternatives ranked (the workload as it is first, then worth it, within noise, not worth
    it, cannot run), one row per alternative and bucket, and the verdict lines."""
    from rich.table import Table

    table = Table(
        title=f"kvplan advise: {advice.workload} on {advice.target} (step times: {advice.step_times};"
        f" SLO capacity at {advice.attainment_target:.0%} attainment; goodput, req/s and TTFT (ms) at each"
        " bucket's top level)",
        title_justify="left",
    )
    columns = ["alternative", "verdict", "KV tokens", "bucket", "max users", "max req/s"]
    columns += ["goodput", "req/s", "TTFT p50", "prefix hits"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("alternative", "verdict", "bucket") else "right")
    ranked = sorted(advice.alternatives, key=lambda a: _ORDER.get(a.verdict, 5))
    for alt in ranked:
        for i, b in enumerate(alt.buckets or [None]):
            first = i == 0
            table.add_row(
                alt.name if first else "",
                alt.verdict if first else "",
                _cell(alt.pool_tokens) if first else "",
                *(
                    [""] * 7
                    if b is None
                    else [
                        f"{b.name} {b.level}" if b.level else b.name,
                        ("≥ " if b.max_users_bound else "") + _cell(b.max_users),
                        _cell(b.max_request_rate),
                        _cell(b.goodput),
                        _cell(b.requests_per_s),
                        _cell(b.ttft_p50_ms, ",.1f"),
                        "" if b.prefix_hit_rate is None else f"{b.prefix_hit_rate:.0%}",
                    ]
                ),
            )
    console.print(table)
    for alt in ranked[1:] if ranked and ranked[0].verdict == "baseline" else ranked:
        measured = "measured on" in alt.condition  # kvplan advise --fp8-quality ran the check
        shown = alt.condition and (alt.verdict == "worth it" or measured)
        condition = f" (condition: {alt.condition})" if shown else ""
        console.print(
            f"{alt.name} ({alt.change}): {alt.verdict}{condition}: {alt.reason}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
