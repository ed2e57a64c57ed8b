"""``kvplan profile``'s tables: a traffic profile (kvplan.profile.stats) as rich tables."""

from __future__ import annotations

from typing import Any

MAX_HOURS_SHOWN = 48  # a longer log's hours are in --json's load.per_hour and load.png


def _num(value: float | None, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def print_profile(data: dict[str, Any], console: Any) -> None:
    """The summary, the length percentiles, the arrivals per hour (up to ``MAX_HOURS_SHOWN``), the top
    shared prefixes and the first bad lines."""
    from rich.table import Table

    arrival, turns, flight, load = data["arrival"], data["turns"], data["in_flight"], data["load"]
    summary = Table(title=f"Traffic profile: {data['source']}", title_justify="left", show_header=False)
    summary.add_column("what")
    summary.add_column("value", justify="right")
    rows = [
        ("requests", f"{data['num_requests']} ({', '.join(f'{k} {v}' for k, v in data['formats'].items())})"),
        *([("log format", data["log_format"])] if data.get("log_format") else []),
        ("bad lines", str(data["num_bad_lines"])),
        *([("failed requests", str(data["num_failed_requests"]))] if data.get("num_failed_requests") else []),
        *([("load level", f"{data['level']} (of {len(data['levels'])})")] if data["level"] else []),
        ("duration, s", _num(data["duration_s"], ".4g")),
        ("arrival rate, req/s", _num(arrival["rate_per_s"], ".4g")),
        ("inter-arrival CV", _num(arrival["cv"])),
        ("gamma shape (1 / CV^2)", _num(arrival["gamma_shape"])),
        (
            "arrivals per minute, P50 / P99 / peak",
            f"{load['p50_per_minute']:.4g} / {load['p99_per_minute']:.4g} / {load['peak_per_minute']}"
            f" (minute {load['peak_minute']} of {load['num_minutes']})",
        ),
        *(
            [("arrivals per hour, peak", f"{load['peak_per_hour']} (hour {load['peak_hour']} of {load['num_hours']})")]
            if load["num_hours"] is not None
            else []
        ),
        (f"prefix reuse ({data['block_size']}-token blocks)", f"{data['prefix_reuse']:.1%}"),
        ("turns per session, mean / max", f"{turns['mean']:.2f} / {turns['max']}" if turns else "-"),
        ("in flight, peak / mean", f"{flight['peak']} / {flight['mean']:.2f}" if flight else "-"),
    ]
    for row in rows:
        summary.add_row(*row)
    console.print(summary)
    lengths = Table(title="Token lengths", title_justify="left")
    for name in ("side", "P50", "P90", "P95", "P99", "max", f"long tail ({data['long_tail']['rule']})"):
        lengths.add_column(name, justify="left" if name == "side" else "right")
    for side in ("input", "output"):
        p = data[f"{side}_tokens"]
        tail = "yes" if data["long_tail"][side] else "no"
        lengths.add_row(side, *(f"{p[k]:.0f}" for k in ("p50", "p90", "p95", "p99", "max")), tail)
    console.print(lengths)
    hours = load["per_hour"]
    if hours is not None and len(hours) <= MAX_HOURS_SHOWN:
        table = Table(title="Arrivals per hour (from the first arrival)", title_justify="left")
        for name in ("hour", "requests", "req/s"):
            table.add_column(name, justify="right")
        for k, count in enumerate(hours):
            table.add_row(str(k), str(count), f"{count / 3600:.3g}")
        console.print(table)
    if data["top_prefixes"]:
        prefixes = Table(title="Shared prefixes (most requests first)", title_justify="left")
        for name in ("tokens", "requests", "share"):
            prefixes.add_column(name, justify="right")
        for p in data["top_prefixes"]:
            prefixes.add_row(str(p["num_tokens"]), str(p["num_requests"]), f"{p['share']:.1%}")
        console.print(prefixes)
    if data.get("reuse_distance"):
        _print_reuse(data["reuse_distance"], console)
    for line in data["bad_lines"]:
        console.print(f"bad line: {line}", style="yellow", markup=False, highlight=False)


def _print_reuse(reuse: dict[str, Any], console: Any) -> None:
    """``--reuse-distance``'s tables: the distances' percentiles and the LRU hit share per cache size."""
    from rich.table import Table

    table = Table(title="Reuse distance (LRU stack)", title_justify="left")
    for name in ("distance", "P50", "P90", "P99", "max"):
        table.add_column(name, justify="left" if name == "distance" else "right")
    for unit, fmt in (("tokens", ".0f"), ("seconds", ".3g")):
        q = reuse[unit]
        table.add_row(unit, *(_num(q[k] if q else None, fmt) for k in ("p50", "p90", "p99", "max")))
    console.print(table)
    line = f"reuses: {reuse['num_reuses']} of {reuse['num_references']} prefix-block references"
    console.print(line, markup=False, highlight=False)
    hits = Table(title="LRU cache: reuses hit", title_justify="left")
    hits.add_column("tokens", justify="right")
    hits.add_column("hit share", justify="right")
    for row in reuse["lru_hits"]:
        hits.add_row(f"{row['tokens']:,}", f"{row['hit_share']:.1%}")
    console.print(hits)
