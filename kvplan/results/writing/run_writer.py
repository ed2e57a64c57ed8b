"""The run's record writer: ``RunWriter`` appends each record to the run folder's JSONL files as
it comes (kvplan.results.store: the lines, the folder), or, for a simulation that keeps its records
in memory, ``LinesBeside`` makes the lines and steps.csv from the kept records a chunk at a time on
forked processes while the run goes on (docs/benchmarks.md#trace-20k)."""

from __future__ import annotations

import gc
import math
import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from itertools import islice
from pathlib import Path
from typing import Any

from kvplan.results.records import LevelKey, RequestRecord, StepRecord, step_values
from kvplan.results.run_lines import FloatTexts, decode_run_records
from kvplan.results.store import (
    REQUESTS_FILE,
    STEPS_FILE,
    KeptRecords,
    RecordLines,
    json_line,
)


class RunWriter:
    """Appends records to the run folder's JSONL files, flushing each line as it is written
    (``flush`` False: lines are written in chunks of ``CHUNK_LINES`` and when the file closes, for a
    simulation that writes thousands a second); ``kept``: where to keep them in memory too (None:
    nowhere). Each line is ``RecordLines``' (json.dumps' bytes). With ``flush`` False and records
    kept, the lines are made from the kept records by ``LinesBeside`` (on another core where one
    is free), not as each record comes; the files are the same, complete once the writer closes."""

    CHUNK_LINES = 2048

    def __init__(self, run_dir: Path, flush: bool = True, kept: KeptRecords | None = None):
        run_dir.mkdir(parents=True, exist_ok=True)
        self._requests = open(run_dir / REQUESTS_FILE, "a", encoding="utf-8")
        self._steps = open(run_dir / STEPS_FILE, "a", encoding="utf-8")
        self._flush = flush
        self._kept = kept
        self._end_texts = FloatTexts()  # the decode runs' end times, the token times of the requests
        self._request_lines, self._step_lines = RecordLines(RequestRecord, self._end_texts), RecordLines(StepRecord)
        self._pending: dict[Any, list[str]] = {self._requests: [], self._steps: []}
        self._beside = LinesBeside(run_dir, kept) if kept is not None and not flush else None

    def _append(self, handle, line: str) -> None:
        if self._flush:
            handle.write(line)
            handle.flush()
            return
        pending = self._pending[handle]
        pending.append(line)
        if len(pending) >= self.CHUNK_LINES:
            handle.write("".join(pending))
            pending.clear()

    def write_request(self, record: RequestRecord) -> None:
        if self._beside is not None and self._kept is not None:
            self._kept.requests.append(record)
            self._beside.poll()
            return
        line = self._request_lines.line(record) if type(record) is RequestRecord else json_line(record)
        self._append(self._requests, line)
        if self._kept is not None:
            self._kept.requests.append(record)

    def write_step(self, record: StepRecord) -> None:
        if type(record) is not StepRecord:  # a subclass: its own fields, a line the kept row cannot give
            self._lines_here()
            self._append(self._steps, json_line(record))
            if self._kept is not None:
                self._kept.steps.append_values(self._step_lines.values(record))
            return
        self._write_step_values(self._step_lines.values(record))

    def write_step_stats(self, key: LevelKey, stats: Any, sizes: Mapping[str, int]) -> None:
        """``write_step(StepRecord.from_stats(key, stats, **sizes))``, without building the record
        (kvplan.results.records.step_values; a simulation writes a million)."""
        self._write_step_values(step_values(key, stats, sizes))

    def write_decode_run(self, key: LevelKey, run: Any, sizes: Mapping[str, Sequence[int]]) -> None:
        """``write_step_stats`` of each step of a decode run (engine.outputs.DecodeRunSteps), with
        ``sizes`` each KV size's column over its steps: the same lines and kept rows, made for the
        run at once (kvplan.results.run_lines) where it can, else step by step."""
        beside = self._beside is not None
        made = decode_run_records(key, run, sizes, self._end_texts, lines=not beside) if len(run) else None
        if made is None:
            for j, stats in enumerate(run):
                self.write_step_stats(key, stats, {name: column[j] for name, column in sizes.items()})
            return
        columns, lines = made
        if self._kept is not None:
            self._kept.steps.extend_columns(columns)
        if self._beside is not None:
            self._beside.poll()
        elif self._flush:
            self._steps.write("".join(lines))
            self._steps.flush()
        else:
            pending = self._pending[self._steps]
            pending += lines
            if len(pending) >= self.CHUNK_LINES:
                self._steps.write("".join(pending))
                pending.clear()

    def _write_step_values(self, values: tuple) -> None:
        if self._beside is not None and self._kept is not None:
            self._kept.steps.append_values(values)
            self._beside.poll()
            return
        self._append(self._steps, self._step_lines.line_of(values))
        if self._kept is not None:
            self._kept.steps.append_values(values)

    def _lines_here(self, final: bool = False) -> None:
        """Stop making lines beside: the kept records not written yet are written now, and every
        later line here as its record comes (``final``: none comes; else steps.csv made beside so
        far is dropped, as later steps will not be in it)."""
        if self._beside is not None:
            beside, self._beside = self._beside, None
            beside.close(later=final and self._kept is not None and self._kept.finish_later)
            if not final and self._kept is not None and self._kept.steps_csv is not None:
                self._kept.steps_csv.discard()
                self._kept.steps_csv = None

    def close(self) -> None:
        try:
            self._lines_here(final=True)
        finally:
            for handle, pending in self._pending.items():
                if pending:
                    handle.write("".join(pending))
                    pending.clear()
                handle.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LinesBeside:
    """A simulation's JSONL lines made from its kept records (``KeptRecords``: steps as
    ``StepRows``, requests as RequestRecords) and appended to the run folder's files a chunk at a
    time, by a process forked from this one while this one goes on simulating: a 20,000-request
    trace's 1.3 million step lines take a core-third of its run (docs/benchmarks.md#trace-20k).

    ``poll()`` (after each record) starts a chunk once ``CHUNK`` steps or requests wait and the
    last chunk's process has ended, so one process writes at a time and the chunks land in order;
    ``close()`` waits for it and writes what is left here. Where a chunk's process fails (it ends
    with a code other than 0, or is killed), both files are cut back to their sizes before it and
    the chunk is written here, raising what writing raises. Where there is no fork, or a single
    core, each chunk is written here. The lines are ``RecordLines``' of the kept values (equal to
    those made as the records come). The forked process ignores Ctrl-C (the run writes its
    report of what finished, and needs the lines), runs only code imported before it, writes
    only its own file objects, and leaves by ``os._exit``: it takes no lock another thread may hold.
    """

    CHUNK = 65_536
    # the young collections' threshold while records are kept (``_start``): what they would walk
    # is mostly records kept since the last chunk, which the next chunk freezes instead
    YOUNG = 1_000_000

    def __init__(self, run_dir: Path, kept: KeptRecords):
        from kvplan.results.csv_tables import StepsCsvChunks  # before any fork: the chunks import nothing
        from kvplan.results.writing.step_texts import step_texts

        self.step_texts = step_texts

        self.paths = (run_dir / STEPS_FILE, run_dir / REQUESTS_FILE)
        self.kept = kept
        self.done = (0, 0)  # steps, requests whose lines are written or being written
        self.fork = hasattr(os, "fork") and (os.cpu_count() or 1) >= 2
        self._child: tuple[int, tuple[tuple[int, int], ...], list[int]] | None = None  # pid, spans, sizes before
        self.csv: StepsCsvChunks | None = StepsCsvChunks(run_dir)  # None: steps.csv left to the report
        self.csv_chunks = 0
        self._collector: tuple[int, ...] | None = None  # gc's thresholds before the first chunk froze records

    def poll(self) -> None:
        """Start the next chunk where one is due and no chunk's process is running."""
        if len(self.kept.steps) - self.done[0] < self.CHUNK and len(self.kept.requests) - self.done[1] < self.CHUNK:
            return
        if self._child is not None and not self._reap(block=False):
            return
        self._start(fork=self.fork)

    def close(self, later: bool = False) -> None:
        """Wait for the running chunk, then write the rest here: the files are whole after this,
        and steps.csv made beside is in ``kept.steps_csv`` (where it is whole: else it is removed).
        ``later``: the rest goes to a forked process where one can be, and ``kept.writing`` is
        what waits for it (``wait``)."""
        try:
            if self._child is not None:
                self._reap(block=True)
            self._start(fork=later and self.fork)
        finally:
            gc.unfreeze()  # the records kept are the collector's again, at its thresholds (``_start``)
            if self._collector is not None:
                gc.set_threshold(*self._collector)
                self._collector = None
            if self._child is None:
                self.wait()
            else:
                self.kept.writing = self.wait

    def wait(self) -> None:
        """Wait for the last chunk (written here again where its process failed); then steps.csv
        made beside is in ``kept.steps_csv`` where it is whole (else it is removed)."""
        try:
            if self._child is not None:
                self._reap(block=True)
        finally:
            if self.csv is not None and self._child is None and self.csv.ready(self.csv_chunks):
                self.kept.steps_csv = self.csv
            elif self.csv is not None:
                self.csv.discard()

    def _start(self, fork: bool) -> None:
        spans = ((self.done[0], len(self.kept.steps)), (self.done[1], len(self.kept.requests)))
        self.done = (spans[0][1], spans[1][1])
        self.csv_chunks += -(-(spans[0][1] - spans[0][0]) // RunWriter.CHUNK_LINES)  # the pieces of steps.csv
        if spans[0][1] == spans[0][0] and spans[1][1] == spans[1][0]:
            return  # nothing new
        # The records kept so far live till the run ends, and hold no cycle: the cyclic collector
        # leaves them (and what else is alive now) till ``close`` gives them back. On the
        # 20,000-request trace its collections took 2.3 of the main process's 28 CPU-s, walking
        # them; a forked chunk's collections touch none of their pages either (Python's gc.freeze).
        # Between chunks the young collections wait for YOUNG objects (the comment there).
        gc.freeze()
        if self._collector is None:
            self._collector = gc.get_threshold()
            gc.set_threshold(max(self.YOUNG, self._collector[0]), *self._collector[1:])
        if fork:
            sizes = [p.stat().st_size if p.exists() else 0 for p in self.paths]
            try:
                pid = os.fork()
            except OSError:
                pid = -1
            if pid == 0:  # the forked process: write the chunk, leave without cleaning up
                code = 1
                try:
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    self._write(spans)
                    code = 0
                finally:
                    os._exit(code)
            if pid > 0:
                self._child = (pid, spans, sizes)
                return
        self._write(spans)

    def _reap(self, block: bool) -> bool:
        """Whether the chunk's process has ended (waited for where ``block``); a failed one's
        chunk is written here again, after its part of the files is cut off."""
        assert self._child is not None
        pid, spans, sizes = self._child
        ended, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        if ended == 0:
            return False
        self._child = None
        if os.waitstatus_to_exitcode(status) != 0:
            if self.csv is not None:  # its chunk may be torn: steps.csv is left to the report
                self.csv.discard()
                self.csv = None
            for path, size in zip(self.paths, sizes):
                with open(path, "r+b") as handle:
                    handle.truncate(size)
            self._write(spans)
        return True

    def _write(self, spans: tuple[tuple[int, int], ...]) -> None:
        (s0, s1), (r0, r1) = spans
        if s1 > s0:
            table = self.csv.appending() if self.csv is not None else nullcontext(None)
            with open(self.paths[0], "a", encoding="utf-8") as handle, table as put:
                for start in range(s0, s1, RunWriter.CHUNK_LINES):
                    columns = [
                        column[start : min(s1, start + RunWriter.CHUNK_LINES)] for column in self.kept.steps.columns()
                    ]
                    made, rows, types = self.step_texts(columns)
                    handle.write(made)
                    if put is not None:
                        put(rows, types, start == 0)
        if r1 > r0:
            # the requests' token times are the ends of the steps they came in: each repr made once
            texts, ends = FloatTexts(), self.kept.steps.column("end_time")[max(0, s1 - 2 * FloatTexts.GENERATION) : s1]
            ends = [e for e in ends if type(e) is float and math.isfinite(e)]
            texts.add(ends, list(map(float.__repr__, ends)))
            lines = RecordLines(RequestRecord, texts)
            each = (lines.line(r) if type(r) is RequestRecord else json_line(r) for r in self.kept.requests[r0:r1])
            with open(self.paths[1], "a", encoding="utf-8") as handle:
                for chunk in _batched(each, RunWriter.CHUNK_LINES):
                    handle.write("".join(chunk))


def _batched(items: Iterable[str], size: int) -> Iterable[list[str]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk
