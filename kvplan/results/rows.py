"""Records read field by field, and a simulation's step records held as columns.

A long simulation writes a million step records (a 20,000-request trace replayed over 3 h:
1,341,207 steps; docs/benchmarks.md#trace-20k), and its report reads a dozen of their fields for
every level summary and every one for steps.csv. ``column`` reads one field of every record in C;
``StepRows`` holds the steps a simulation's writer kept (kvplan.results.store.KeptRecords) as one
list per field (no object per step; a decode run's steps are added as columns at once,
kvplan.results.run_lines), so a column is read with no pass over the steps, and is a
``Sequence[StepRecord]`` for every other reader (each record built as it is read, equal to the
one written).
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
    """Step records held as columns: one list per StepRecord field, in field order, entry i of
    each being step i's value (kvplan.results.records.step_values gives a step's values in field
    order). Indexing and iterating give StepRecords (kvplan.results.records.step_record; a slice
    gives StepRows); ``rows`` gives the steps as tuples of values; two are equal when their
    columns are, and equal to any sequence of the same records. ``column(name)`` is the list held
    (no pass over the steps): read it, never change it."""

    __slots__ = ("_columns",)

    def __init__(self, rows: Sequence[tuple] | None = None):
        self._columns: list[list[Any]] = [[] for _ in _AT]
        for values in rows or ():
            self.append_values(values)

    @classmethod
    def of_columns(cls, columns: Sequence[Sequence[Any]]) -> StepRows:
        """StepRows holding these columns (one per field, in field order, all as long)."""
        rows = cls()
        rows.extend_columns(columns)
        return rows

    @property
    def rows(self) -> list[tuple]:
        """Each step's field values in field order, as tuples (made on each read)."""
        return list(zip(*self._columns))

    def __len__(self) -> int:
        return len(self._columns[0])

    @overload
    def __getitem__(self, index: int) -> StepRecord: ...

    @overload
    def __getitem__(self, index: slice) -> StepRows: ...

    def __getitem__(self, index: int | slice) -> StepRecord | StepRows:
        if isinstance(index, slice):
            return StepRows.of_columns([c[index] for c in self._columns])
        return step_record([c[index] for c in self._columns])

    def __iter__(self) -> Iterator[StepRecord]:
        return map(step_record, zip(*self._columns))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepRows):
            return self._columns == other._columns
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def append_values(self, values: Sequence[Any]) -> None:
        """Add one step: its field values in field order.

        Raises:
            ValueError: not one value per field.
        """
        if len(values) != len(self._columns):
            raise ValueError(f"a step has {len(self._columns)} field values (got {len(values)})")
        for column, value in zip(self._columns, values):
            column.append(value)

    def extend_columns(self, columns: Sequence[Sequence[Any]]) -> None:
        """Add steps given as columns: one per field, in field order, all as long.

        Raises:
            ValueError: not one column per field, or columns of different lengths.
        """
        if len(columns) != len(self._columns) or len({len(c) for c in columns}) > 1:
            raise ValueError(f"steps as columns: {len(self._columns)} columns of one length")
        for column, more in zip(self._columns, columns):
            column.extend(more)

    def columns(self) -> list[list[Any]]:
        """Every field's list held, in field order (read them, never change them)."""
        return self._columns

    def column(self, name: str) -> list[Any]:
        """Field ``name`` of every step, in order: the list held (read it, never change it).

        Raises:
            AttributeError: ``name`` is no StepRecord field.
        """
        if name not in _AT:
            raise AttributeError(f"'StepRecord' object has no attribute '{name}'")
        return self._columns[_AT[name]]

    def pick(self, positions: Sequence[int]) -> StepRows:
        """The steps at ``positions``, as StepRows: this one where they are all of them, in order."""
        if len(positions) == len(self) and positions == list(range(len(self))):
            return self
        take = itemgetter(*positions) if len(positions) > 1 else (lambda c: (c[positions[0]],) if positions else ())
        return StepRows.of_columns([list(take(c)) for c in self._columns])

    def levels(self) -> Iterator[tuple]:
        """Each step's ``LEVEL_FIELDS`` values, as a tuple."""
        return zip(*(self._columns[_AT[f]] for f in LEVEL_FIELDS))


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
        columns = [records.column(f) for f in LEVEL_FIELDS]
        if columns[0] and all(c.count(c[0]) == len(c) for c in columns):  # one level (a trace's replay)
            return {tuple(c[0] for c in columns): list(range(len(records)))}
        levels = records.levels()
    else:
        levels = map(attrgetter(*LEVEL_FIELDS), records)
    positions: dict[tuple, list[int]] = {}
    for i, level in enumerate(levels):
        positions.setdefault(level, []).append(i)
    return positions


def pick(records: Sequence[Any], positions: list[int]) -> Sequence[Any]:
    """The records at ``positions``: StepRows of StepRows, else a list."""
    if isinstance(records, StepRows):
        return records.pick(positions)
    return [records[i] for i in positions]
