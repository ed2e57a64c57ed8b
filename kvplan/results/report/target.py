"""The report's part for a run against a remote server (``source: target``): the server as the
pre-flight found it, its KV pool beside kvplan's estimate, per level what its /metrics said, the
failures by reason, open-loop rates requested against achieved, and the client's own overhead.
Values the server does not expose show as ``unavailable``, never as 0."""

from __future__ import annotations

import pandas as pd

from kvplan.results.metrics import LevelSummary
from kvplan.results.run_result import ClientLevel, RunResult

NA = "unavailable"


def _pct(value: float | None) -> str:
    return NA if value is None else f"{value:.1%}"


def _client(result: RunResult, level: LevelSummary) -> ClientLevel | None:
    return next(
        (
            c
            for c in result.client
            if (c.bucket, c.mode, c.level, c.variant) == (level.bucket, level.mode, level.level, level.variant)
        ),
        None,
    )


def server_table(result: RunResult) -> pd.DataFrame:
    """One row per level: server preemptions and KV usage, failures, rates, client lag."""
    rows = []
    for lv in result.levels:
        client = _client(result, lv)
        rows.append(
            {
                "bucket": lv.bucket,
                "level": lv.key.label,
                "server preemptions": NA if lv.server_preemptions is None else lv.server_preemptions,
                "server peak KV": _pct(lv.server_peak_kv_usage),
                "server mean KV": _pct(lv.server_mean_kv_usage),
                "failed": lv.num_errors,
                "failures": ", ".join(f"{k} x{v}" for k, v in lv.error_reasons.items()) or "-",
                "short outputs": lv.num_short_outputs,
                "req/s asked": lv.requested_rate,
                "req/s sent": lv.achieved_rate,
                "client lag p99 ms": None if client is None else client.lag_p99_ms,
                "client CPU %": None if client is None or not client.wall_s else 100 * client.cpu_s / client.wall_s,
                "client behind": None if client is None else ("yes" if client.behind else "no"),
            }
        )
    return pd.DataFrame(rows)


def target_lines(result: RunResult) -> list[str]:
    """The header lines naming the server (empty for an in-process run)."""
    s = result.server
    if s is None:
        return []
    metrics = (
        "read every " + str(s.scrape_interval_ms) + " ms (" + ", ".join(s.metrics_seen) + ")"
        if s.metrics_available
        else NA + " (no /metrics with known names)"
    )
    lines = [
        f"- server: {s.url}, model `{s.model}` ({s.kind or 'unknown server'}), API {s.api},"
        f" prompts as {s.prompt_format}, exact lengths"
        f" {'asked (ignore_eos + min_tokens)' if s.exact_lengths else 'not asked (max_tokens only)'}",
        f"- server metrics: {metrics}",
        f"- {s.pool_note}" if s.pool_note else "- server KV pool: unavailable",
    ]
    if result.stop_reason:
        lines.append(f"- stopped early: {result.stop_reason}")
    return lines


def target_markdown(result: RunResult) -> list[str]:
    """The ``Server`` section of summary.md (empty for an in-process run)."""
    if result.server is None:
        return []
    from kvplan.results.report.tables import to_markdown

    note = (
        "Server preemptions: the difference of its preemption counter across the level (read at the level's"
        " start and end); KV usage: its gauge, read every scrape interval (a peak shorter than one interval"
        " can fall between reads). Client lag: how late the client's 5 ms timer fired, an upper bound on"
        " how late a chunk's arrival was stamped; behind: lag P99 over 1 ms or an open-loop send over"
        " 10 ms late."
    )
    return ["", "## Server (remote target)", "", note, "", to_markdown(server_table(result)).rstrip("\n")]
