"""The workload's ``dataset.sessions:``: multi-turn sessions instead of single requests.

::

    dataset: {kind: sharegpt, sessions: {max_turns: 4, think_time_s: [1, 5]}}

A session is one user's conversation: turn k's prompt is the whole history (turns 1..k-1, human
messages and recorded replies) plus human message k, so with prefix caching turn k reuses the
blocks of turn k-1's prompt. kvplan.workload.buckets' ``Dataset`` holds this section;
kvplan.traffic.sessions samples sessions and checks the rules across sections, and
kvplan.run.session_loop runs them.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import Field, PlainValidator, WithJsonSchema

from kvplan.workload.lengths import StrictModel

MAX_THINK_S = 24 * 3600  # a pause longer than a level may last (kvplan.workload.schema.MAX_LEVEL_S) is a typo
MAX_TURNS = 1000  # turn k's prompt holds all k - 1 before it: more turns than this is a typo, not a chat
_SECONDS = {"type": "number", "minimum": 0, "maximum": MAX_THINK_S}


def _think_time(value: Any) -> float | list[float]:
    """A think time as written: seconds (``2.5``) or a range ``[min, max]`` of seconds, each >= 0."""
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and len(value) != 2:
        raise ValueError(f"a range is [min, max], two numbers of seconds (got {len(value)} items)")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise ValueError(f"give seconds (2.5) or a range [min, max] of seconds (got {item!r})")
        if not math.isfinite(item) or item < 0:
            raise ValueError(f"must be a finite number of seconds >= 0 (got {item!r})")
        if item > MAX_THINK_S:
            raise ValueError(f"must be at most {MAX_THINK_S} s, the 24 h a level may last (got {item:g})")
    if isinstance(value, list):
        if value[0] > value[1]:
            raise ValueError(f"min must be <= max (got [{value[0]}, {value[1]}])")
        return [float(item) for item in value]
    return float(value)


# seconds, or [min, max] seconds drawn uniformly; kept as written, read by Sessions.think_range
ThinkTime = Annotated[
    float | list[float],
    PlainValidator(_think_time),
    WithJsonSchema({"anyOf": [_SECONDS, {"type": "array", "items": _SECONDS, "minItems": 2, "maxItems": 2}]}),
]


class Sessions(StrictModel):
    """Multi-turn sessions (``dataset.sessions``; sharegpt and random only): each of a bucket's
    ``num_requests`` is a session of up to ``max_turns`` turns. Turn k's prompt is the chat history
    of turns 1..k-1 (human messages and the recorded replies) plus human message k; a user sends
    turn k ``think_time_s`` after turn k-1 finished. ``input_tokens`` ranges each new human
    message, ``output_tokens`` each reply (its ``max_tokens``)."""

    max_turns: Annotated[int, Field(ge=1, le=MAX_TURNS)] = Field(
        description="The most turns (a human message and its reply) a session sends: a ShareGPT session keeps"
        " its conversation's turns while each message fits the bucket's ranges, up to this many (at least"
        " the first); a random session has exactly this many."
    )
    think_time_s: ThinkTime = Field(
        0.0,
        description="The pause between a turn's finish and the next turn's arrival, s: a number, or"
        " ``[min, max]`` s drawn uniformly per turn (seeded); >= 0. 0 = the next turn at once.",
    )

    @property
    def think_range(self) -> tuple[float, float]:
        """(min, max) think time, seconds."""
        value = self.think_time_s
        return (value[0], value[1]) if isinstance(value, list) else (value, value)
