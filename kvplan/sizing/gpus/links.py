"""The link table and the price of moving a prompt's KV from a prefill worker to a decode worker.

``data/links.yaml`` holds each link's bandwidth (10**9 bytes/s, one direction) and setup latency
with its public source. A disaggregated deployment (DISAGG semantics, docs/simulate.md) moves
each request's prompt KV once, when a decode worker admits its handoff::

    bytes   = the prompt's paged KV on one GPU rank: ceil(prompt / block_size) blocks of every
              layer of the rank (kvplan.sizing.kv_math.request_bytes, recurrent state included),
              at the smaller tp of the two pools (each rank moves its share over its own link,
              in parallel; the pool with fewer ranks holds the larger share per rank)
    seconds = setup + bytes / bandwidth                    (alone on the link)

Concurrent transfers on one link share its bandwidth equally (processor sharing, as Dynamo's
mocker shares its KV bandwidth): :class:`SharedLink`. Two transfers of ``b`` bytes started
together each take ``setup + 2 b / bandwidth``.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.sizing import kv_math
from kvplan.sizing.models.model_spec import ModelSpec

LINKS_FILE = Path(__file__).parents[1] / "data" / "links.yaml"


@dataclass(frozen=True)
class Link:
    """One link: ``bytes_per_s`` (one direction), ``setup_s`` (paid once per transfer before its
    bytes flow), and where the figures come from."""

    name: str
    bytes_per_s: float
    setup_s: float
    source: str = ""

    def seconds(self, num_bytes: float) -> float:
        """Seconds one transfer of ``num_bytes`` takes alone on this link: setup + bytes / bandwidth."""
        return self.setup_s + num_bytes / self.bytes_per_s


@lru_cache(maxsize=1)
def link_table() -> dict[str, dict]:
    """Canonical link name -> entry of kvplan/sizing/data/links.yaml (``gbps``, ``setup_us``,
    ``source``, optional ``aliases``)."""
    from kvplan.yaml_input import load_data

    return load_data(LINKS_FILE.read_text())["links"]


def _key(name: str) -> str:
    return name.strip().lower().replace(" ", "-").replace("_", "-")


def _names() -> dict[str, str]:
    return {_key(n): canonical for canonical, e in link_table().items() for n in (canonical, *e.get("aliases", []))}


def lookup_link(link: str | dict[str, Any], field_name: str = "link") -> Link:
    """The link a name of the table (any case, or an alias) or an own ``{gbps, setup_us}`` mapping
    stands for.

    Raises:
        KvplanError: naming ``field_name``: an unknown name (the closest known ones, then every
            name of the table, on one line), or a mapping with a key other than ``gbps`` and
            ``setup_us``, without a positive ``gbps`` or with a negative ``setup_us``.
    """
    if isinstance(link, dict):
        extra = sorted(map(str, set(link) - {"gbps", "setup_us"}))
        if extra:  # a misspelt setup_us would otherwise be 0 without a word
            raise KvplanError(
                field_name,
                f"unknown key {extra[0]!r}; a link takes `gbps` and `setup_us`",
                "e.g. {gbps: 50, setup_us: 5}",
            )
        gbps, setup = link.get("gbps"), link.get("setup_us", 0)
        if not isinstance(gbps, int | float) or isinstance(gbps, bool) or gbps <= 0:
            raise KvplanError(field_name, f"needs a `gbps` above 0 (got {gbps!r})", "e.g. {gbps: 50, setup_us: 5}")
        if not isinstance(setup, int | float) or isinstance(setup, bool) or setup < 0:
            raise KvplanError(field_name, f"`setup_us` must be >= 0 (got {setup!r})", "e.g. {gbps: 50, setup_us: 5}")
        return Link("custom", float(gbps) * 1e9, float(setup) / 1e6, "given in the workload")
    canonical = _names().get(_key(str(link)))
    if canonical is None:
        close = difflib.get_close_matches(_key(str(link)), list(_names()), n=3, cutoff=0.6)
        near = ", ".join(dict.fromkeys(_names()[c] for c in close))
        raise KvplanError(
            field_name,
            f"unknown link {link!r}" + (f" (closest: {near})" if near else ""),
            f"use one of {', '.join(link_table())}; or give {{gbps: N, setup_us: N}}",
        )
    entry = link_table()[canonical]
    return Link(canonical, float(entry["gbps"]) * 1e9, float(entry["setup_us"]) / 1e6, str(entry["source"]))


def prompt_transfer_bytes(
    spec: ModelSpec, num_prompt_tokens: int, block_size: int, kv_cache_dtype: str = "auto", tp: int = 1
) -> int:
    """Bytes one GPU rank moves for a prompt of ``num_prompt_tokens`` tokens: its whole blocks
    (``ceil(tokens / block_size)``) of every layer the rank holds at ``tp``, plus any recurrent
    state (kvplan.sizing.kv_math.request_bytes). Pass the smaller tp of the two pools.

    Example (hand arithmetic): Llama-3.1-8B bf16, tp 1, 1,000 tokens in blocks of 16: 63 blocks x
    16 x 131,072 bytes = 132,120,576.

    Raises:
        KvplanError: a bad tp or KV dtype (kvplan.sizing.kv_math).
    """
    layers = kv_math.rank_layer_specs(spec, kv_cache_dtype, tp)
    return kv_math.request_bytes(layers, num_prompt_tokens, block_size)


@dataclass
class _Transfer:
    ready: float  # when its bytes start to flow (start + setup)
    remaining: float  # bytes still to move
    total: float


@dataclass
class SharedLink:
    """One link that transfers share equally while their bytes flow (each waits out its own
    setup first). Times in seconds on the caller's clock; keys are the caller's (request ids).

    ``start(key, now, bytes)`` adds a transfer; ``next_end()`` is the time the first one still
    moving ends (None: none); ``take_done(now)`` advances to ``now`` and returns the keys done
    by then, in end order (ties in start order)."""

    link: Link
    now: float = 0.0
    _moving: dict[Any, _Transfer] = field(default_factory=dict)
    _next_end: tuple[float | None] | None = None  # next_end() until start or take_done changes the state

    def __len__(self) -> int:
        return len(self._moving)

    def start(self, key: Any, now: float, num_bytes: float) -> None:
        self._next_end = None
        self._advance(now)
        self._moving[key] = _Transfer(now + self.link.setup_s, float(num_bytes), float(num_bytes))

    def next_end(self) -> float | None:
        if self._next_end is None:
            self._next_end = (self._first_end(),)
        return self._next_end[0]

    def _first_end(self) -> float | None:
        if not self._moving:
            return None
        saved = self.now, {k: _Transfer(t.ready, t.remaining, t.total) for k, t in self._moving.items()}
        done = self._advance(math.inf, stop_at_first=True)
        self.now, self._moving = saved[0], saved[1]
        return done

    def take_done(self, now: float) -> list[Any]:
        self._next_end = None
        self._advance(now)
        done = [k for k, t in self._moving.items() if self._is_done(t) and t.ready <= now]
        for key in done:
            del self._moving[key]
        return done

    def _is_done(self, t: _Transfer) -> bool:
        """Its bytes moved, up to the float residue of the shared-rate arithmetic: a few bytes in
        10**9 of it, or less than the clock can still tell apart at ``now`` (at 1,000 s the 1e-13 s
        its float steps by: 1e-3 bytes at 10 GB/s; a residue the clock cannot move is done)."""
        return t.remaining <= 1e-9 * t.total + 1e-6 or self.now + t.remaining / self.link.bytes_per_s == self.now

    def _advance(self, to: float, stop_at_first: bool = False) -> float:
        """Move bytes from ``self.now`` to ``to``, the rate changing whenever a transfer's setup
        ends or a transfer finishes; with ``stop_at_first``, stop at the first finish and return
        its time."""
        while self.now < to:
            flowing = [t for t in self._moving.values() if t.ready <= self.now and not self._is_done(t)]
            if stop_at_first and any(t.ready <= self.now and self._is_done(t) for t in self._moving.values()):
                return self.now
            waiting = [t.ready for t in self._moving.values() if t.ready > self.now]
            rate = self.link.bytes_per_s / len(flowing) if flowing else 0.0
            least = min((t.remaining for t in flowing), default=math.inf)
            finish = self.now + least / rate if flowing else math.inf
            step_to = min(to, min(waiting, default=math.inf), finish)
            if step_to == math.inf:
                return math.inf
            moved = rate * (step_to - self.now)
            for t in flowing:
                ends = t.remaining == least  # it finishes at `finish` by definition, whatever the float residue
                t.remaining -= moved
                if step_to == finish and (ends or self._is_done(t)):
                    # once residue past the byte tolerance: at 1,000 s a 8 KiB transfer at 10 GB/s
                    # kept 4.6e-4 bytes, `finish` rounded to `now` and the link never finished it
                    t.remaining = 0.0
            self.now = step_to
            if stop_at_first and step_to == finish:
                return step_to
        return self.now
