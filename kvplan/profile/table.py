"""A log's requests as compact columns: what ``kvplan profile`` keeps per request while it streams a
log (kvplan.profile.stream), a few numbers each in ``array`` columns (45 bytes a request,
never a Python object per request or per token), so the lengths' percentiles stay exact up to
millions of requests.

``RequestTable`` grows a row per request in file order; ``RequestColumns`` is the same in arrival
order (ties in line order, as kvplan.profile.parsed.read_log sorts), as numpy arrays, which
kvplan.profile.stats reads. A session id (text) is kept once, as a code; so is a format name.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvplan.profile.log import LoggedRequest


@dataclass(frozen=True)
class RequestColumns:
    """Per request, in arrival order: its line, arrival and finish (s; NaN: unknown), lengths,
    session code (-1: none; equal codes, one session), user messages (-1: unknown), the engine's
    cached tokens (-1: unknown) and format (an index into ``formats``)."""

    lines: np.ndarray
    arrivals_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    finish_s: np.ndarray
    sessions: np.ndarray
    user_turns: np.ndarray
    cached_tokens: np.ndarray
    format_codes: np.ndarray
    formats: tuple[str, ...]

    @classmethod
    def from_requests(cls, requests: Sequence[LoggedRequest]) -> RequestColumns:
        """The columns of requests already in arrival order (kvplan.profile.parsed.read_log's)."""
        table = RequestTable()
        for r in requests:
            table.add(r)
        return table.columns(order=np.arange(len(requests)))


class RequestTable:
    """Rows appended in file order (``add``); ``columns`` sorts them into arrival order."""

    def __init__(self) -> None:
        self.lines = array("q")
        self.arrivals_s = array("d")
        self.finish_s = array("d")
        self.input_tokens = array("i")  # int32: lengths are at most 2^24 (kvplan.profile.log.MAX_TOKENS)
        self.output_tokens = array("i")
        self.sessions = array("i")
        self.user_turns = array("i")
        self.cached_tokens = array("i")
        self.format_codes = array("b")
        self._session_codes: dict[str, int] = {}
        self._format_codes: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.lines)

    def add(self, r: LoggedRequest) -> None:
        """One request's row (its token ids are not kept)."""
        self.lines.append(r.line)
        self.arrivals_s.append(r.arrival_s)
        self.finish_s.append(np.nan if r.finish_s is None else r.finish_s)
        self.input_tokens.append(r.input_tokens)
        self.output_tokens.append(r.output_tokens)
        codes = self._session_codes
        self.sessions.append(-1 if r.session is None else codes.setdefault(r.session, len(codes)))
        self.user_turns.append(-1 if r.user_turns is None else r.user_turns)
        self.cached_tokens.append(-1 if r.cached_tokens is None else r.cached_tokens)
        self.format_codes.append(self._format_codes.setdefault(r.fmt, len(self._format_codes)))

    def arrival_order(self) -> np.ndarray:
        """The rows' indices in arrival order, ties in line order."""
        return np.lexsort((np.frombuffer(self.lines, np.int64), np.frombuffer(self.arrivals_s, np.float64)))

    def columns(self, order: np.ndarray | None = None) -> RequestColumns:
        """The rows as numpy arrays, in ``order`` (default: arrival order)."""
        order = self.arrival_order() if order is None else order

        def column(values: array, dtype: type) -> np.ndarray:
            stored = np.frombuffer(
                values, {"q": np.int64, "d": np.float64, "i": np.int32, "b": np.int8}[values.typecode]
            )
            return stored[order].astype(dtype) if len(values) else np.zeros(0, dtype)

        return RequestColumns(
            lines=column(self.lines, np.int64),
            arrivals_s=column(self.arrivals_s, np.float64),
            input_tokens=column(self.input_tokens, np.int64),
            output_tokens=column(self.output_tokens, np.int64),
            finish_s=column(self.finish_s, np.float64),
            sessions=column(self.sessions, np.int64),
            user_turns=column(self.user_turns, np.int64),
            cached_tokens=column(self.cached_tokens, np.int64),
            format_codes=column(self.format_codes, np.int8),
            formats=tuple(self._format_codes),
        )
