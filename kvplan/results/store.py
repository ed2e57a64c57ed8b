"""The run folder on disk: records appended as they happen, files replaced atomically.

Run folder (``reports/<name>-<timestamp>/``)::

    results.json     the run result (kvplan.results.run_result), replaced atomically
    requests.jsonl   one RequestRecord per finished request, appended and flushed at once
    steps.jsonl      one StepRecord per engine step, appended and flushed at once
    requests.csv     the same requests as a table, steps.csv the same steps (views)
    workload.yaml    the workload file as it was read
    summary.md, *.png    views, rebuilt by ``kvplan report DIR``

A run killed mid-write leaves at most one torn last line per JSONL file; ``read_jsonl`` drops it.
Whole files are written to a temporary file in the same folder, then ``os.replace``d, so a reader
never sees half a file.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kvplan.errors import KvplanError, describe_error
from kvplan.results.records import RequestRecord, StepRecord, field_names

REQUESTS_FILE, STEPS_FILE = "requests.jsonl", "steps.jsonl"
REPORTS_ROOT = Path("reports")
_NAME_MAX = 255  # bytes in one path component on Linux filesystems


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace`` (atomic on POSIX).
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
                handle.write(text)
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
    steps: list[StepRecord] = field(default_factory=list)


class RunWriter:
    """Appends records to the run folder's JSONL files, flushing each line as it is written
    (``flush`` False: when the file closes, for a simulation that writes thousands a second);
    ``kept``: where to keep them in memory too (None: nowhere)."""

    def __init__(self, run_dir: Path, flush: bool = True, kept: KeptRecords | None = None):
        run_dir.mkdir(parents=True, exist_ok=True)
        self._requests = open(run_dir / REQUESTS_FILE, "a", encoding="utf-8")
        self._steps = open(run_dir / STEPS_FILE, "a", encoding="utf-8")
        self._flush = flush
        self._kept = kept

    def _append(self, handle, record) -> None:
        # a shallow dict: asdict would deep-copy every tuple of token times first
        handle.write(json.dumps({name: getattr(record, name) for name in field_names(type(record))}) + "\n")
        if self._flush:
            handle.flush()

    def write_request(self, record: RequestRecord) -> None:
        self._append(self._requests, record)
        if self._kept is not None:
            self._kept.requests.append(record)

    def write_step(self, record: StepRecord) -> None:
        self._append(self._steps, record)
        if self._kept is not None:
            self._kept.steps.append(record)

    def close(self) -> None:
        self._requests.close()
        self._steps.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
