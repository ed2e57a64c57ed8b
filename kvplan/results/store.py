"""The run folder on disk: records appended as they happen, files replaced atomically.

Run folder (``reports/<name>-<timestamp>/``)::

    results.json     the run result (kvplan.results.run_result), replaced atomically
    requests.jsonl   one RequestRecord per finished request, appended and flushed at once
    steps.jsonl      one StepRecord per engine step, appended and flushed at once
    requests.csv     the same requests as a table, steps.csv the same steps (views)
    workload.yaml    the workload file as it was read
    summary.md, *.png    views, rebuilt by ``kvplan report DIR``

The records are written by kvplan.results.writing.run_writer.RunWriter; a simulation (records kept in memory,
``KeptRecords``) appends its lines in chunks made from the kept records by forked processes
(kvplan.results.writing.run_writer.LinesBeside), which make steps.csv too; its files are whole once the run ends.
A run killed mid-write leaves at most one torn last line per JSONL file;
``read_jsonl`` drops it.
Whole files are written to a temporary file in the same folder, then ``os.replace``d, so a reader
never sees half a file.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import TypeAdapter, ValidationError

from kvplan.errors import KvplanError, describe_error
from kvplan.results.records import RequestRecord, StepRecord, field_names
from kvplan.results.rows import StepRows
from kvplan.results.run_lines import FloatTexts

REQUESTS_FILE, STEPS_FILE = "requests.jsonl", "steps.jsonl"
STEP_FIELDS = field_names(StepRecord)
REPORTS_ROOT = Path("reports")
_NAME_MAX = 255  # bytes in one path component on Linux filesystems


def write_atomic(path: Path, text: str | Iterable[str]) -> None:
    """Write ``text`` (a str, or its pieces in order: a long table written a chunk at a time) to
    ``path`` through a temporary file and ``os.replace`` (atomic on POSIX).
    The file gets the mode of any new file (0666 less the umask), as the JSONL and PNGs do;
    ``tempfile.mkstemp`` would leave it 0600.

    Raises:
        KvplanError: the file cannot be written (a folder in its place, a full disk), one line.
    """
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                if isinstance(text, str):
                    handle.write(text)
                else:
                    for piece in text:
                        handle.write(piece)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise KvplanError(
            "", f"cannot write it ({err.strerror or err})", "make room, or remove what is in the way", source=str(path)
        ) from None


@dataclass
class KeptRecords:
    """The records a RunWriter wrote, also kept in memory (a simulation's), in the order written, so
    the run's summaries read no file back: the same records ``read_jsonl`` would give (the JSON
    round trip keeps every value: ints, floats by repr, tuples)."""

    requests: list[RequestRecord] = field(default_factory=list)
    steps: StepRows = field(default_factory=StepRows)  # a million steps of a long simulation: as rows
    # steps.csv made from these steps while they came (kvplan.results.csv_tables.StepsCsvChunks:
    # its ``finish`` puts it in place), or None: to be written from them
    steps_csv: Any = None
    # True: the writer's close leaves its last lines to a forked process and puts in ``writing``
    # what waits for them (the caller summarizes meanwhile; kvplan.run.lifecycle.finish_run)
    finish_later: bool = False
    writing: Callable[[], None] | None = None

    def written(self) -> None:
        """Wait for the lines still being written (``writing``), if any: the files are whole after."""
        if self.writing is not None:
            wait, self.writing = self.writing, None
            wait()


_ENCODE = json.JSONEncoder().encode  # json.dumps' own settings, without its per-call checks
_FORMATS: dict[type, str] = {int: "%d", float: "%r", str: "%s", tuple: "%s", type(None): "null"}


class RecordLines:
    """JSON lines of one record dataclass, each equal byte for byte to
    ``json.dumps({name: getattr(record, name) for name in field_names(type)}) + "\n"`` (the line
    the run folder's JSONL files have always held; their keys are a contract, docs/reports.md).

    A step record of a long simulation is 40-odd numbers and a few arrays, written 240,000 times
    for a 20,000-request trace (docs/benchmarks.md#trace-20k): instead of a dict per record and
    the encoder walking it, the values are read in one ``attrgetter`` call and put into a
    %-template made once per combination of value types (the keys written into it once). Only
    exact ``int``, ``float``, ``str``, ``tuple`` and ``None`` values take the template, where it
    writes what ``json.dumps`` writes (``int`` and ``float`` reprs, ASCII-escaped strings, arrays
    by the json encoder itself); a float that is not finite (json writes NaN / Infinity), or any
    other type (bool, a numpy scalar, a subclass), makes that line ``json.dumps``' own. An
    array that is the same object as the last one in its field (a decode run's request ids,
    engine.decode_run) is encoded once.
    """

    def __init__(self, record_type: type, float_texts: FloatTexts | None = None):
        self._names = field_names(record_type)
        self._float_texts = float_texts  # reprs of floats written before (a request's token times)
        self._values = attrgetter(*self._names)
        self._plans: dict[tuple[type, ...], _Plan | None] = {}
        self._last: dict[int, tuple[tuple, str]] = {}  # array position -> (the last array there, its JSON)

    def _plan(self, types: tuple[type, ...]) -> _Plan | None:
        """The plan for values of these exact types (None: a type the template does not write)."""
        if any(t not in _FORMATS for t in types):
            return None
        template = ", ".join(
            f"{_ENCODE(name).replace('%', '%%')}: {_FORMATS[t]}" for name, t in zip(self._names, types)
        )
        kept = [i for i, t in enumerate(types) if t is not type(None)]  # None is written into the template
        if len(kept) < 2:  # itemgetter of one would give the value, not a tuple
            return None
        kinds = [types[i] for i in kept]
        return _Plan(
            "{" + template + "}\n",
            tuple(i for i, t in enumerate(types) if t is float),
            itemgetter(*kept) if len(kept) < len(types) else None,
            tuple(j for j, t in enumerate(kinds) if t is str),
            tuple(j for j, t in enumerate(kinds) if t is tuple),
        )

    def values(self, record: Any) -> tuple:
        """``record``'s field values, in field order."""
        return self._values(record)

    def line(self, record: Any) -> str:
        """``record``'s JSON line, newline included."""
        return self.line_of(self._values(record))

    def line_of(self, values: tuple) -> str:
        """The JSON line of a record whose field values (in field order) are ``values``."""
        types = tuple(map(type, values))
        plan = self._plans[types] if types in self._plans else self._plans.setdefault(types, self._plan(types))
        if plan is None or (plan.floats and not all(math.isfinite(values[i]) for i in plan.floats)):
            return json.dumps(dict(zip(self._names, values))) + "\n"
        out = list(values if plan.kept is None else plan.kept(values))
        for j in plan.strings:
            out[j] = encode_basestring_ascii(out[j])
        for j in plan.arrays:
            out[j] = self._array(j, out[j])
        return plan.template % tuple(out)

    def _array(self, position: int, value: tuple) -> str:
        if not value:
            return "[]"
        last = self._last.get(position)
        if last is not None and last[0] is value:
            return last[1]
        text = self._float_texts.array(value) if self._float_texts is not None else None
        text = _ENCODE(value) if text is None else text
        self._last[position] = (value, text)
        return text


class _Plan(NamedTuple):
    """RecordLines' plan for one combination of value types: the line's %-template (keys in it, %
    doubled), the positions of the float values (checked finite), what picks the values the
    template takes (None: all; a None value is written into it), and, among those, the
    positions of the strings and of the arrays (encoded before the template takes them)."""

    template: str
    floats: tuple[int, ...]
    kept: Callable[[tuple], tuple] | None
    strings: tuple[int, ...]
    arrays: tuple[int, ...]


def json_line(record: Any) -> str:
    """A record of another dataclass (a subclass): json.dumps of its fields, as RecordLines writes."""
    # a shallow dict: asdict would deep-copy every tuple of token times first
    return json.dumps({name: getattr(record, name) for name in field_names(type(record))}) + "\n"


_ADAPTERS: dict[type, TypeAdapter[Any]] = {
    RequestRecord: TypeAdapter(RequestRecord),
    StepRecord: TypeAdapter(StepRecord),
}


def read_jsonl(path: Path, record_type: type) -> list:
    """The records of one JSONL file, each checked against its dataclass (unknown keys ignored);
    [] when there is no file (``kvplan.results.run_result.check_records`` says whether that is allowed).

    Raises:
        KvplanError: an unreadable file, or a line (other than a torn last one) that is not a record.
    """
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise KvplanError("", f"cannot read the records ({err})", source=str(path)) from None
    adapter = _ADAPTERS.get(record_type) or _ADAPTERS.setdefault(record_type, TypeAdapter(record_type))
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(adapter.validate_json(line, strict=True))
        except ValidationError as err:
            if err.errors()[0]["type"] == "json_invalid":
                if number == len(lines):  # torn last line of a killed run
                    break
                raise KvplanError(f"line {number}", "not valid JSON", source=str(path)) from None
            if err.errors()[0]["type"] in ("dataclass_type", "dataclass_exact_type"):
                raise KvplanError(f"line {number}", "must be a JSON object (a record)", source=str(path)) from None
            field, problem = describe_error(err)
            raise KvplanError(f"line {number}: {field}", problem, source=str(path)) from None
    return records


# ---- the run folder itself ------------------------------------------------------------------
def check_out(run_dir: Path | None) -> None:
    """Refuse an ``out`` folder that cannot become a new run folder, before any work: a
    non-empty folder (appending would mix two runs' records), a file, a path under a file, a
    component longer than the filesystem allows.

    Raises:
        KvplanError: naming ``out``.
    """
    if run_dir is None:
        return
    fix = "give a new folder (or remove that one)"
    if any(len(part.encode()) > _NAME_MAX for part in run_dir.parts):
        raise KvplanError(
            "out", f"a folder name in {str(run_dir)[:60]}... is over {_NAME_MAX} bytes", "give a shorter path"
        )
    try:
        if run_dir.is_dir():
            if any(run_dir.iterdir()):
                raise KvplanError("out", f"{run_dir} is not empty", fix)
            return
    except OSError as err:
        raise KvplanError("out", f"cannot read {run_dir} ({err.strerror or err})", fix) from None
    if run_dir.exists():
        raise KvplanError("out", f"{run_dir} is a file, not a folder", "give a new folder path")
    above = next((p for p in run_dir.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise KvplanError("out", f"{above} is a file, so {run_dir} cannot be a folder", "give a new folder path")


def create_run_dir(name: str, run_dir: Path | None, root: Path = REPORTS_ROOT) -> Path:
    """Create the run folder: ``run_dir``, or ``<root>/<name>-<YYYYmmdd-HHMMSS>/`` with a counter
    if that second is taken.

    Raises:
        KvplanError: the folder cannot be created (read-only place, a file in the way, ...).
    """
    if run_dir is not None:
        _mkdir(run_dir, "out", "give a writable folder path")
        return run_dir
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = root / (f"{name}-{stamp}" + (f"-{n}" if n else ""))
        if _mkdir(path, str(root), "pass `out` with a writable folder path", exist_ok=False):
            return path
    raise KvplanError(str(root), "cannot create a new run folder (1000 taken this second)", "pass `out`")


def _mkdir(path: Path, where: str, fix: str, exist_ok: bool = True) -> bool:
    """True when ``path`` was created (or, with exist_ok, is an empty folder already)."""
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
        return True
    except FileExistsError:
        if exist_ok:  # a file where the folder should be
            raise KvplanError(where, f"cannot create folder {path} (a file is in the way)", fix) from None
        return False
    except OSError as err:
        raise KvplanError(where, f"cannot create folder {path} ({err.strerror or err})", fix) from None
