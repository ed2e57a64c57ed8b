"""The report's part for a run against a remote server (``source: target``): the server as the
pre-flight found it, its KV pool beside kvplan's estimate, the knee as far as the server lets it
be seen, per level what its /metrics said, the failures by reason, open-loop rates requested
against achieved, the client's own overhead, and the server's KV usage over time.

Values the server does not expose show as ``unavailable``, never as 0 or an empty cell; the
engine-only views (the KV cache per level table, estimated against measured KV per step) are left
out of a target run's report (kvplan.results.report.tables and .render; the stand-in tables: .target_tables)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from kvplan.results.metrics import LevelSummary
from kvplan.results.report.target_tables import NA, _or_na, target_knee_note  # noqa: F401  (summary.py reads the note here)
from kvplan.results.run_result import ClientLevel, RunResult, ServerInfo
from kvplan.results.stats.server_samples import ServerSample

if TYPE_CHECKING:  # matplotlib loads only where a chart is drawn
    from matplotlib.axes import Axes


def kv_usage_label(server: ServerInfo | None) -> str:
    """How the server's usage gauge is named in tables and charts: ``KV``, or the gauge's own name
    where it is not KV usage (SGLang's token_usage on a hybrid model)."""
    return "KV" if server is None or server.kv_usage_note is None else "token_usage (not KV: hybrid model)"


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
    usage = kv_usage_label(result.server)
    rows = []
    for lv in result.levels:
        client = _client(result, lv)
        rows.append(
            {
                "bucket": lv.bucket,
                "level": lv.key.label,
                "server preemptions": NA if lv.server_preemptions is None else lv.server_preemptions,
                f"server peak {usage}": _pct(lv.server_peak_kv_usage),
                f"server mean {usage}": _pct(lv.server_mean_kv_usage),
                "server out tokens": NA if lv.server_output_tokens is None else lv.server_output_tokens,
                "server prefix hits": _pct(lv.server_prefix_hit_rate),
                "failed": lv.num_errors,
                "failures": ", ".join(f"{k} x{v}" for k, v in lv.error_reasons.items()) or "-",
                "short outputs": lv.num_short_outputs,
                "req/s asked": "-" if lv.requested_rate is None else lv.requested_rate,
                "req/s sent": "-" if lv.achieved_rate is None else lv.achieved_rate,
                "client lag p99 ms": _or_na(None if client is None else client.lag_p99_ms),
                "client stamp delay p99 ms": _or_na(None if client is None else client.stamp_delay_p99_ms),
                "client CPU %": NA if client is None or not client.wall_s else 100 * client.cpu_s / client.wall_s,
                "client behind": NA if client is None else _behind(client),
            }
        )
    return pd.DataFrame(rows)


def _behind(client: ClientLevel) -> str:
    if not client.behind:
        return "no"
    return f"yes: {client.behind_reason}" if client.behind_reason else "yes"


def plot_server_kv(ax: Axes, samples: Sequence[ServerSample], server: ServerInfo | None) -> None:
    """The server's KV usage (0..100 %) at each /metrics read against time since the first read,
    one line per level; says ``unavailable`` when the server exposes no usage gauge."""
    usage = kv_usage_label(server)
    ax.set_title(f"Server {usage} usage over time (its /metrics)")
    read = [s for s in samples if s.kv_usage is not None]
    if not read:
        from kvplan.results.report.plots import no_data

        return no_data(ax, f"the server exposes no {usage} usage ({NA})")
    t0 = min(s.time for s in read)
    by_level: dict[str, list[ServerSample]] = {}
    for sample in sorted(read, key=lambda s: s.time):
        by_level.setdefault(sample.key.name, []).append(sample)
    for name, own in by_level.items():
        ax.plot([s.time - t0 for s in own], [100 * (s.kv_usage or 0.0) for s in own], marker=".", label=name)
    ax.set_ylim(0, 105)
    ax.set_xlabel("time since the first read (s)")
    ax.set_ylabel(f"server {usage} usage (%)")
    ax.legend(fontsize=7, ncol=3)


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
        " can fall between reads); out tokens: its generated-token counter across the level; unavailable:"
        " the server does not expose it. Client lag: how late the client's 5 ms timer fired (P99 over"
        " ticks), an upper bound on how late a chunk's arrival was stamped; stamp delay: the same P99 over"
        " time (each lateness weighted by the time its tick spans). Behind: the stamp delay P99 above 5% of"
        " the level's TTFT P50, or, open loop, sends late by a P99 above a tenth of the mean inter-arrival"
        " time."
    )
    if result.server.kv_usage_note:
        note += f" Usage gauge: {result.server.kv_usage_note}."
    return ["", "## Server (remote target)", "", note, "", to_markdown(server_table(result)).rstrip("\n")]
