"""Records read field by field, and a simulation's step records held as rows.

A long simulation writes a million step records (a 20,000-request trace replayed over 3 h:
1,341,207 steps; docs/benchmarks.md#trace-20k), and its report reads a dozen of their fields for
every level summary and every one for steps.csv. ``column`` reads one field of every record in C;
``StepRows`` holds the steps a simulation's writer kept (kvplan.results.store.KeptRecords) as
tuples of their field values (one tuple instead of an object and its 50-key __dict__ per step),
reads a column as one ``itemgetter`` over the tuples, and is a ``Sequence[StepRecord]`` for every
other reader (each record built as it is read, equal to the one written).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import attrgetter, itemgetter
from typing import Any, overload

from kvplan.results.records import StepRecord, field_names, step_record

_NO_DEFAULT: Any = object()
LEVEL_FIELDS = ("bucket", "mode", "level", "variant")  # a record's LevelKey, as a tuple
_AT = {name: i for i, name in enumerate(field_names(StepRecord))}


class StepRows(Sequence[StepRecord]):
    """Step records as rows: ``rows[i]`` holds step i's StepRecord field values in field order
    (kvplan.results.records.step_values). Indexing and iterating give StepRecords
    (kvplan.results.records.step_record; a slice gives StepRows); two are equal when their rows
    are, and equal to any sequence of the same records."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[tuple] | None = None):
        self.rows: list[tuple] = [] if rows is None else rows

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> StepRecord: ...

    @overload
    def __getitem__(self, index: slice) -> StepRows: ...

    def __getitem__(self, index: int | slice) -> StepRecord | StepRows:
        if isinstance(index, slice):
            return StepRows(self.rows[index])
        return step_record(self.rows[index])

    def __iter__(self) -> Iterator[StepRecord]:
        return map(step_record, self.rows)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepRows):
            return self.rows == other.rows
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def append_values(self, values: tuple) -> None:
        """Add one step: its field values in field order."""
        self.rows.append(values)

    def column(self, name: str) -> list[Any]:
        """Field ``name`` of every step, in order.

        Raises:
            AttributeError: ``name`` is no StepRecord field.
        """
        if name not in _AT:
            raise AttributeError(f"'StepRecord' object has no attribute '{name}'")
        return list(map(itemgetter(_AT[name]), self.rows))


def column(records: Sequence[Any], name: str, default: Any = _NO_DEFAULT) -> list[Any]:
    """Field ``name`` of every record, in order, as ``[getattr(r, name) for r in records]`` gives it,
    read in C (one attrgetter over the list, or StepRows' own columns). ``default``: the value for a
    record without the field (a simulation's search probes keep the scheduler's StepStats, without
    the KV sizes); without one, such a record raises AttributeError."""
    try:
        if isinstance(records, StepRows):
            return records.column(name)
        return list(map(attrgetter(name), records))
    except AttributeError:
        if default is _NO_DEFAULT:
            raise
        return [getattr(r, name, default) for r in records]


def by_level(records: Sequence[Any]) -> dict[tuple, list[int]]:
    """The positions of each level's records, by the level as a ``LEVEL_FIELDS`` tuple (two equal
    exactly when their LevelKeys are), levels in the order they first appear."""
    if isinstance(records, StepRows):
        levels = map(itemgetter(*(_AT[f] for f in LEVEL_FIELDS)), records.rows)
    else:
        levels = map(attrgetter(*LEVEL_FIELDS), records)
    positions: dict[tuple, list[int]] = {}
    for i, level in enumerate(levels):
        positions.setdefault(level, []).append(i)
    return positions


def pick(records: Sequence[Any], positions: list[int]) -> Sequence[Any]:
    """The records at ``positions``: StepRows of StepRows, else a list."""
    if isinstance(records, StepRows):
        rows = records.rows
        return StepRows([rows[i] for i in positions])
    return [records[i] for i in positions]
