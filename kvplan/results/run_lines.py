"""A decode run's step records made at once: their rows and JSON lines, equal to the step-by-step ones.

A simulation's decode run (engine.decode_run) is k steps in which only a few fields move, by
rules known in advance (engine.outputs.DecodeRunSteps)::

    step j:  step_index first + j, start/end_time starts[j] / ends[j], used/peak blocks used + grown_j,
             free blocks free - grown_j, kv_resident_tokens (c_i + j + 1 for each request),
             context / attended / decode context tokens context0 + n x j, the four KV sizes
    every other field: as in step 0

A 20,000-request trace replays 1.3 million such steps (docs/benchmarks.md#trace-20k); built
one by one, each step costs a StepStats, a dict of KV sizes, a tuple of 50 values and a line
through RecordLines' per-type plan. Here step 0's values are read once through the ordinary path
(``step_values``), every constant field of the line is encoded once into a %-template by
``json.dumps`` itself, and each step fills only the moving fields. The rows are exactly
``step_values(key, run[j], sizes_j)`` and the lines exactly ``json.dumps`` of the record's
fields (RecordLines' bytes), or nothing is made (``decode_run_records`` gives None) and the
caller takes the ordinary path: a time that is not a finite float, a count that is not an int.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from itertools import accumulate, chain, repeat
from json.encoder import encode_basestring_ascii
from typing import Any

from kvplan.results.records import LevelKey, StepRecord, field_names, step_values

# the fields a decode run's steps differ in, in the order each step's moving values are given
MOVING = (
    *("step_index", "start_time", "end_time", "num_used_blocks", "num_free_blocks", "kv_resident_tokens"),
    *("ideal_bytes", "paged_bytes", "contiguous_bytes", "measured_bytes", "num_peak_used_blocks"),
    *("num_context_tokens", "num_attended_tokens", "num_decode_context_tokens"),
)
assert [n for n in field_names(StepRecord) if n in MOVING] == list(MOVING), "MOVING: in field order"
_SIZES = ("ideal_bytes", "paged_bytes", "contiguous_bytes", "measured_bytes")
_FLOATS = frozenset(("start_time", "end_time"))
_TEXT = "kv_resident_tokens"  # in the template as one %d per request
_TOKENS = "\x00tokens\x00"  # its place in the template till the run's request count is known


def grown_blocks(run: Any) -> list[int]:
    """Blocks the run has taken by the end of each of its steps (``run.used_blocks(j) - run.used``),
    from ``run.taken_steps`` (the step of each block taken, ascending) in one pass."""
    counts = [0] * len(run)
    for step in run.taken_steps:
        counts[step] += 1
    return list(accumulate(counts))


def decode_run_records(
    key: LevelKey,
    run: Any,
    sizes: Mapping[str, Sequence[int]],
    texts: FloatTexts | None = None,
    lines: bool = True,
) -> tuple[list[Sequence[Any]], list[str]] | None:
    """The StepRecord columns (one per field, in field order, each holding the run's steps in
    order) and JSON lines (newline included) of each step of ``run`` (an
    engine.outputs.DecodeRunSteps of at least one step), with ``sizes``: each KV size's column
    over the run's steps (kvplan.run.estimate.KVPricing.run_bytes). Step j's values (the j-th of
    each column) equal ``step_values(key, run[j], {name: sizes[name][j]})``; line j equals RecordLines'
    line of them (``json.dumps`` of the fields, kvplan.results.store). None where a moving value is
    not of the type the template writes as json does (times: finite floats; counts and sizes: ints).
    ``texts``: where to keep the end times' reprs (for the token times of the requests, FloatTexts).
    ``lines`` False: the columns only, and no lines ([]; a writer that makes them elsewhere from
    the columns, kvplan.results.writing.run_writer.LinesBeside).
    """
    k, n, computed = len(run), len(run.computed), run.computed
    starts, ends = run.starts, run.ends
    if not (_all_type(computed, int) and _all_type(starts, float) and _all_type(ends, float)):
        return None
    if not all(map(math.isfinite, starts)) or not all(map(math.isfinite, ends)):
        return None
    columns = [sizes[name] for name in _SIZES]
    if any(len(column) != k or not _all_type(column, int) for column in columns):
        return None
    scalars = (run.first_index, run.used, run.free, run.context0)
    if not _all_type(scalars, int):
        return None
    names = field_names(StepRecord)
    base = step_values(key, run[0], {name: sizes[name][0] for name in _SIZES})
    moving = {_AT[name] for name in MOVING}
    if lines:
        try:
            parts = [
                _PLACEHOLDERS[name] if i in moving else _KEYS[i] + _encoded(base[i]) for i, name in enumerate(names)
            ]
        except (TypeError, ValueError):  # a value json cannot write: the ordinary path says so
            return None
    grown = grown_blocks(run)
    used = [run.used + g for g in grown]
    free = [run.free - g for g in grown]
    context = list(range(run.context0, run.context0 + n * k, n)) if n else [run.context0] * k
    first = run.first_index
    # step j - 1: c_i + j for each request i, the tuples made by zip in C
    tokens = list(zip(*[range(c + 1, c + k + 1) for c in computed])) if n else [()] * k
    made: list[str] = []
    if lines:
        # the resident tokens' array as n %d's (json writes an int list as its reprs, ", " between)
        template = ("{" + ", ".join(parts) + "}\n").replace(_TOKENS, "[" + ", ".join(["%d"] * n) + "]")
        end_texts, start_texts = float_texts(ends, starts)
        if texts is not None:
            texts.add(ends, end_texts)
        made = [
            template % (first + j, start, end, u, f, *toks, ideal, paged, whole, measured, u, ctx, ctx, ctx)
            for j, start, end, u, f, toks, ideal, paged, whole, measured, ctx in zip(
                range(k), start_texts, end_texts, used, free, tokens, *columns, context
            )
        ]
    moved = dict(zip(MOVING, (list(range(first, first + k)), starts, ends, used, free, tokens, *columns, used)))
    moved.update(num_context_tokens=context, num_attended_tokens=context, num_decode_context_tokens=context)
    return [moved[name] if name in moved else [base[i]] * k for i, name in enumerate(names)], made


def float_texts(ends: Sequence[float], starts: Sequence[float]) -> tuple[list[str], list[str]]:
    """The reprs of ``ends`` and of ``starts`` (finite floats), each computed once: a decode run's
    step j + 1 starts when step j ends, so start j + 1 takes end j's text where the two are equal and
    not zero (equal floats other than 0.0 and -0.0 are the same double, so the same repr)."""
    end_texts = list(map(float.__repr__, ends))
    start_texts = [float.__repr__(starts[0])] if starts else []
    start_texts += [
        text if start == end and start else float.__repr__(start)
        for start, end, text in zip(starts[1:], ends, end_texts)
    ]
    return end_texts, start_texts


class FloatTexts:
    """The reprs of the step end times written lately, for the token times of the requests that
    finish after them: json.dumps of a request's ``token_times`` is a repr per float (a 20,000-request
    trace's requests.jsonl holds 7 million, docs/benchmarks.md#trace-20k), and its tokens came at
    the ends of steps just written, each repr made once there (``float_texts``). ``array`` gives
    json.dumps' text of a tuple of floats from these reprs, a repr made where one is missing.

    Exact: a value is found by ``==`` (with its hash), and two equal floats other than 0.0 and -0.0
    are the same double, with the same repr; so no zero is kept, and only exact floats are looked up
    (an int equal to a kept float would otherwise get its text). Two generations of ``GENERATION``
    values each: a request whose tokens span more steps makes the older reprs again.
    """

    GENERATION = 1 << 16

    def __init__(self) -> None:
        self._new: dict[float, str] = {}
        self._old: dict[float, str] = {}

    def add(self, values: Sequence[float], texts: Sequence[str]) -> None:
        """Keep ``texts[i]``, the repr of the finite float ``values[i]``, for each i."""
        self._new.update(zip(values, texts))
        self._new.pop(0.0, None)  # 0.0 or -0.0, whichever is there: equal, but written apart
        if len(self._new) >= self.GENERATION:
            self._old, self._new = self._new, {}

    def array(self, values: tuple) -> str | None:
        """``json.dumps(values)`` for a non-empty tuple of finite exact floats, else None."""
        if set(map(type, values)) != {float}:
            return None
        texts = list(map(self._new.get, values))
        if None in texts:
            old = self._old
            texts = [old.get(v) or _finite_repr(v) if t is None else t for v, t in zip(values, texts)]
            if None in texts:
                return None
        return "[" + ", ".join(texts) + "]"  # type: ignore[arg-type]  # no None left: checked above


def _finite_repr(value: float) -> str | None:
    return float.__repr__(value) if math.isfinite(value) else None


def _placeholder(name: str) -> str:
    return _TOKENS if name == _TEXT else "%d" if name not in _FLOATS else "%s"


_AT = {name: i for i, name in enumerate(field_names(StepRecord))}
_KEYS = [json.dumps(name).replace("%", "%%") + ": " for name in field_names(StepRecord)]  # each key, once
_PLACEHOLDERS = {name: _KEYS[field_names(StepRecord).index(name)] + _placeholder(name) for name in MOVING}
_ENCODE = json.JSONEncoder().encode  # json.dumps' own settings, without its per-call checks


def _encoded(value: Any) -> str:
    """``json.dumps(value)`` with every % doubled (a fixed field in the template): the common
    types without json.dumps' per-call work (an exact int or str, None, an empty tuple)."""
    kind = type(value)
    if kind is int:
        return int.__repr__(value)
    if kind is str:
        return encode_basestring_ascii(value).replace("%", "%%")
    if value is None:
        return "null"
    if kind is tuple and not value:
        return "[]"
    return _ENCODE(value).replace("%", "%%")


def _all_type(values: Sequence[Any], kind: type) -> bool:
    """Every value is exactly of type ``kind`` (a subclass, such as bool for int, is not)."""
    return set(map(type, values)) <= {kind}


def column_lines(names: Sequence[str], columns: Sequence[Sequence[Any]]) -> list[str] | None:
    """The JSON lines (newline included) of the records whose field ``names[i]`` holds
    ``columns[i][j]`` in record j: ``json.dumps`` of each record's fields, made a column at a time
    (a chunk of a simulation's kept steps, kvplan.results.writing.step_texts). A column of one
    value is written into the line's %-template once; each other value's text is made once per
    distinct value (floats, strings) or per run of the same array object. None where a column
    holds more than one type, a type other than exact int, float, str, None or tuple, or a float
    that is not finite (json writes NaN / Infinity): make those lines one by one then.

    Raises:
        ValueError: no columns, or columns of different lengths.
    """
    if not columns or len({len(c) for c in columns}) != 1:
        raise ValueError("column_lines: one or more columns of one length")
    made = columns_texts(columns)
    return None if made is None else lines_of(names, made, len(columns[0]))


ColumnTexts = tuple[type, str, Sequence[Any] | None]  # (its one type, fixed text or "%d" or "", each value's text)


def columns_texts(columns: Sequence[Sequence[Any]]) -> list[ColumnTexts] | None:
    """Each column's ``column_texts``, or None where one has none (or json cannot write a value)."""
    made = []
    try:
        for column in columns:
            texts = column_texts(column)
            if texts is None:
                return None
            made.append(texts)
    except (TypeError, ValueError):  # a value json cannot write: the line by line path says so
        return None
    return made


def lines_of(names: Sequence[str], made: Sequence[ColumnTexts], rows: int) -> list[str]:
    """The ``rows`` JSON lines of columns ``names`` whose ``column_texts`` are ``made``."""
    parts, moving = [], []
    for name, (_, fixed, texts) in zip(names, made):
        key = json.dumps(name).replace("%", "%%") + ": "
        if texts is None:
            parts.append(key + fixed.replace("%", "%%"))
        else:  # "%d": the column's ints themselves (int.__repr__ is what %d writes of an exact int)
            parts.append(key + (fixed or "%s"))
            moving.append(texts)
    template = "{" + ", ".join(parts) + "}\n"
    if not moving:
        return [template % ()] * rows
    return list(map(template.__mod__, zip(*moving)))


def column_texts(column: Sequence[Any]) -> ColumnTexts | None:
    """A column's JSON texts (``json.dumps`` of each value), with its one type: (type, the text of
    every value, None) for a column of one value; (type, "", each value's text) for another column
    of one JSON type, (int, "%d", the column) for one of ints; None for a column of several types,
    of another type, or with a float json writes as NaN / Infinity."""
    kinds = set(map(type, column))
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    first = column[0]
    if kind is float:
        if not all(map(math.isfinite, column)):
            return None
        if first and column.count(first) == len(column):  # a zero is written apart from its sign
            return float, float.__repr__(first), None
        distinct = set(column)
        if 4 * len(distinct) > len(column):  # mostly distinct (a step's times): each made as it comes
            return float, "", list(map(float.__repr__, column))
        memo = {v: float.__repr__(v) for v in distinct}
        memo.pop(0.0, None)  # 0.0 and -0.0: equal, written apart
        texts = list(map(memo.get, column))
        if None in texts:
            texts = [float.__repr__(v) if t is None else t for t, v in zip(texts, column)]
        return float, "", texts
    if kind is type(None):
        return kind, "null", None
    if kind is int:
        if column.count(first) == len(column):
            return int, int.__repr__(first), None
        return int, "%d", column
    if kind is str:
        if column.count(first) == len(column):
            return str, encode_basestring_ascii(first), None
        memo = {v: encode_basestring_ascii(v) for v in set(column)}
        return str, "", list(map(memo.__getitem__, column))
    if kind is tuple:
        return tuple, "", _tuple_texts(column)
    return None


def _tuple_texts(column: Sequence[tuple]) -> list[str]:
    """json.dumps of each tuple: of exact ints (a step's resident tokens, a new tuple each step) from
    the tuple's own repr, "(1, 2)" or "(1,)" made "[1, 2]" and "[1]" in C; else json's, once per run
    of the same tuple object (a decode run's resident request ids)."""
    if set(map(type, chain.from_iterable(column))) <= {int}:  # not a bool, which json writes as true
        texts = map(str.replace, map(tuple.__repr__, column), repeat(",)"), repeat(")"))
        texts = map(str.replace, texts, repeat("("), repeat("["))
        return list(map(str.replace, texts, repeat(")"), repeat("]")))
    made, last, text = [], None, ""
    for value in column:
        if value is not last:
            last, text = value, _ENCODE(value) if value else "[]"
        made.append(text)
    return made
