"""summary.md's per-turn table of a run with multi-turn sessions (``dataset.sessions``): per session
level and turn, the requests completed, TTFT and the prompt tokens the prefix cache served
(kvplan.results.stats.turns). Absent for a run without sessions.
"""

from __future__ import annotations

import pandas as pd

from kvplan.results.report import tables
from kvplan.results.run_result import RunResult


def turns_table(result: RunResult) -> pd.DataFrame:
    """One row per session level and turn: completed requests, TTFT P50 / P99 (ms), prefix hit
    tokens and their percentage of the turn's prompt tokens."""
    rows = [
        {
            "bucket": level.bucket,
            "level": tables.level_name(level),
            "turn": turn.turn,
            "completed": f"{turn.num_completed}/{turn.num_requests}",
            "TTFT P50": None if turn.ttft_ms is None else turn.ttft_ms.p50,
            "TTFT P99": None if turn.ttft_ms is None else turn.ttft_ms.p99,
            "prefix hit tokens": turn.prefix_hit_tokens,
            "hit % of prompt": None if turn.prefix_hit_fraction is None else round(100 * turn.prefix_hit_fraction, 1),
        }
        for level in result.levels
        for turn in level.turns or []
    ]
    return pd.DataFrame(rows)


def turns_markdown(result: RunResult) -> list[str]:
    """summary.md's section ([] for a run without session levels)."""
    frame = turns_table(result)
    if frame.empty:
        return []
    return [
        "",
        "## Sessions: per turn",
        "",
        "Turn k's prompt holds the session's turns 1..k-1 (prompts and recorded replies) and message k;"
        " its TTFT counts from its arrival, its previous turn's finish plus the think time. Prefix hit"
        " tokens: the turn's prompt tokens served by the prefix cache (the full blocks of the previous"
        " turn's prompt, under the level's cache salt: the engine generated its own reply, so the recorded"
        " one misses), summed over its requests. TTFT in ms.",
        "",
        tables.to_markdown(frame).rstrip("\n"),
    ]
