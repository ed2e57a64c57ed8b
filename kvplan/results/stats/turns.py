"""Per-turn statistics of a level of multi-turn sessions (``dataset.sessions``, kvplan.traffic.sessions):
pure functions of its request records.

Turn k's prompt holds turns 1..k-1 (prompts and replies), so with prefix caching its cached
tokens grow with k while the tokens it prefills stay one message's worth; the table shows how
TTFT and the prefix hits move along a session. TTFT is computed as the level's is
(kvplan.results.stats.latency), over the turn's completed requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kvplan.results.records import RequestRecord
from kvplan.results.stats.latency import LatencyStats, _Summary, completed, latency_stats, ttft_s


class TurnSummary(_Summary):
    """One turn index of a session level, over the requests of that turn (every session that got so
    far): completed requests, their TTFT (ms), and the sums over all of them of ``num_cached_tokens``
    (``prefix_hit_tokens``: prompt tokens served by the prefix cache; None against a remote target,
    whose answers do not say) and of prompt tokens."""

    turn: int = Field(description="The turn index, 1-based.")
    num_requests: int = Field(description="Requests of that turn.")
    num_completed: int = Field(description="Of them, completed.")
    ttft_ms: LatencyStats | None = Field(description="TTFT of the completed ones, ms.")
    prefix_hit_tokens: int | None = Field(
        description="Prompt tokens served by the prefix cache; null against a remote target."
    )
    prompt_tokens: int = Field(description="Their prompt tokens.")

    @property
    def prefix_hit_fraction(self) -> float | None:
        """prefix_hit_tokens / prompt_tokens (0..1); None without prompt tokens or hit counts."""
        if self.prefix_hit_tokens is None or not self.prompt_tokens:
            return None
        return self.prefix_hit_tokens / self.prompt_tokens


def turn_summaries(requests: Sequence[RequestRecord]) -> list[TurnSummary] | None:
    """One summary per turn, in turn order; None for a level whose requests carry no turn."""
    by_turn: dict[int, list[RequestRecord]] = {}
    for r in requests:
        if r.turn is not None:
            by_turn.setdefault(r.turn, []).append(r)
    if not by_turn:
        return None
    out = []
    for turn in sorted(by_turn):
        own = by_turn[turn]
        done = [r for r in own if completed(r)]
        out.append(
            TurnSummary(
                turn=turn,
                num_requests=len(own),
                num_completed=len(done),
                ttft_ms=latency_stats([t for r in done if (t := ttft_s(r)) is not None]),
                # a remote target's requests (sent_time set) carry no cached-token count: unknown, not 0
                prefix_hit_tokens=None
                if all(r.sent_time is not None for r in own)
                else sum(r.num_cached_tokens for r in own),
                prompt_tokens=sum(r.num_prompt_tokens for r in own),
            )
        )
    return out
