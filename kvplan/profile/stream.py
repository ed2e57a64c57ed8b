"""``kvplan profile``'s read: a log or trace read once, as a stream, into its traffic profile.

Lines are read one at a time (kvplan.profile.log.file_lines), in every format kvplan.profile.log
and kvplan.profile.csv_traces read, with the same bad lines and errors. Each request leaves a row of
a few numbers (kvplan.profile.table) and, where its prompt's tokens are known, its chain of prefix
units (kvplan.profile.blocks); its token ids are never kept. An OpenAI line's text is tokenized
``CHUNK`` lines at a time. Memory is then the rows (some 80 bytes a request, the block index's
counts and a line's offset included) and the distinct prefix blocks (24 bytes each), not the tokens.

Prefix reuse counts what an earlier request held, so chains go to the block index in arrival order
(ties in line order): held back until ``2 x BATCH`` chains or ``2 x BATCH_UNITS`` units are, then
the earlier half sorted and given, so a log out of order by fewer lines than that half (one written
as requests finish) is read once. A chain arriving before one already given (a log further out of
order) turns that off: the chains are read again at the end, in arrival order, from their lines'
byte offsets (an OpenAI line's text tokenized again).
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from kvplan.errors import KvplanError
from kvplan.profile import csv_traces
from kvplan.profile.blocks import MOONCAKE_UNIT, BlockIndex, id_array, mooncake_keys, token_keys
from kvplan.profile.columns import EXAMPLE, ColumnMap
from kvplan.profile.log import BadLine, LoggedRequest, Tokenize, _Bad, file_lines, read_line
from kvplan.profile.parsed import check_level, left_out_note, tokenized
from kvplan.profile.stats import MAX_BAD_SHOWN, TrafficProfile, block_hashes, build_profile
from kvplan.profile.table import RequestTable

CHUNK = 4096  # lines read before their text is tokenized
BATCH = 16384  # chains given to the block index at a time, at most
BATCH_UNITS = 1 << 18  # their units, at most (the index's work arrays: some 150 bytes a unit)

# a chain held back: (arrival s, line, row in the table, its tokens, unit, its data: a Mooncake
# line's hash ids (uint64) or a tokenized prompt's unit keys, whether Mooncake's)
_Held = tuple[float, int, int, int, int, np.ndarray, bool]
_Chain = tuple[int, int, np.ndarray, bool]  # a chain's tokens, unit, data, whether Mooncake's


class _Chains:
    """Chains held back and given to the block index in arrival order (module docstring)."""

    def __init__(self, index: BlockIndex):
        self.index, self.held, self.units = index, list[_Held](), 0
        self.last: tuple[float, int] = (-np.inf, -1)
        self.in_order = True

    def hold(self, item: _Held) -> None:
        if not self.in_order:
            return
        if item[:2] < self.last:
            self.in_order, self.held = False, []
            return
        self.held.append(item)
        self.units += len(item[5])
        if len(self.held) >= 2 * BATCH or self.units >= 2 * BATCH_UNITS:
            self.held.sort(key=lambda h: h[:2])
            half = max(1, len(self.held) // 2)
            self.give(self.held[:half])
            self.last, self.held = self.held[half - 1][:2], self.held[half:]
            self.units = sum(len(h[5]) for h in self.held)

    def give(self, items: list[_Held]) -> None:
        """Chains in arrival order to the block index, at most BATCH_UNITS units at a time."""
        start, units = 0, 0
        for end, item in enumerate(items, 1):
            units += len(item[5])
            if units >= BATCH_UNITS or end - start >= BATCH or end == len(items):
                self._give(items[start:end])
                start, units = end, 0

    def _give(self, items: list[_Held]) -> None:
        rows = np.array([h[2] for h in items], dtype=np.int64)
        lengths = np.array([h[3] for h in items], dtype=np.int64)
        units = np.array([h[4] for h in items], dtype=np.int64)
        counts = np.array([len(h[5]) for h in items], dtype=np.int64)
        mooncake = np.array([h[6] for h in items], dtype=bool) & (counts > 0)
        keys = np.concatenate([h[5] for h in items]) if len(items) else np.zeros(0, np.uint64)
        on = np.repeat(mooncake, counts)
        if on.any():
            keys[on] = mooncake_keys(keys[on], counts[mooncake])
        arrivals = np.array([h[0] for h in items], dtype=np.float64)
        self.index.add(rows, lengths, units, counts, keys, arrivals)

    def finish(self) -> None:
        if self.in_order:
            self.held.sort(key=lambda h: h[:2])
            self.give(self.held)
            self.held = []


class _Read:
    """What a read keeps besides the rows: bad lines (counted, the first few described), failed
    requests, content parts left out, levels."""

    def __init__(self, source: str, fmt: str, level: str | None, block_size: int, record: bool = False):
        self.source, self.fmt, self.level, self.block_size = source, fmt, level, block_size
        self.table = RequestTable()
        self.index = BlockIndex(block_size, record)
        self.chains = _Chains(self.index)
        self.num_bad, self.bad_shown = 0, list[BadLine]()
        self.num_failed = 0
        self.first_failed: int | None = None
        self.left_out: Counter[str] = Counter()
        self.levels: dict[str, None] = {}
        self.kept: str | None = None
        self.first_format: str | None = None
        self.num_good = 0  # good requests, of every level
        self.chain_rows, self.chain_offsets = array("i"), array("q")  # rows with chains, their lines' offsets

    def bad(self, n: int, err: _Bad) -> None:
        self.num_bad += 1
        if len(self.bad_shown) < MAX_BAD_SHOWN:
            self.bad_shown.append(BadLine(n, err.field, err.problem))

    def add(self, request: LoggedRequest, offset: int, chain: _Chain | None) -> None:
        """A good request (``chain``: its tokens, unit, data and kind, or None), unless of a level not kept."""
        self.num_good += 1
        if request.level is not None:
            self.levels.setdefault(request.level)
            if self.level != "all":
                if self.kept is None:
                    self.kept = self.level if self.level is not None else request.level
                if request.level != self.kept:
                    return
        if self.first_format is None:
            self.first_format = request.fmt
        row = len(self.table)
        self.table.add(request)
        if chain is not None:
            self.chain_rows.append(row)
            self.chain_offsets.append(offset)
            self.chains.hold((request.arrival_s, request.line, row, *chain))


def _prompt_chain(token_ids: tuple[int, ...] | list[int], block_size: int) -> _Chain:
    """A tokenized prompt's chain: its tokens, the block size, its blocks' keys."""
    return len(token_ids), block_size, token_keys(block_hashes(tuple(token_ids), block_size)), False


def _jsonl_chunk(read: _Read, chunk: list[tuple[int, int, bytes]], tokenize: Tokenize | None) -> None:
    """A chunk of JSONL lines: read, their text tokenized in one batch, added in line order."""
    good: list[tuple[LoggedRequest, int, np.ndarray | None]] = []
    texts: list[tuple[int, str | None, str | None]] = []
    for n, offset, raw in chunk:
        try:
            request, hash_ids, prompt, output, skipped = read_line(n, raw, read.fmt, tokenize is not None)
        except _Bad as err:
            read.bad(n, err)
            continue
        if prompt is not None or output is not None:
            texts.append((len(good), prompt, output))
        if request.input_tokens < 0:
            read.left_out.update(skipped)
        good.append((request, offset, None if hash_ids is None else id_array(hash_ids)))
    requests = [g[0] for g in good]
    if texts and tokenize is not None:
        requests = tokenized(requests, texts, tokenize)
    for request, (_, offset, ids) in zip(requests, good):
        chain: _Chain | None = None
        if ids is not None:
            chain = (request.input_tokens, MOONCAKE_UNIT, ids, True)
        elif request.token_ids is not None:
            chain = _prompt_chain(request.token_ids, read.block_size)
        read.add(request if request.token_ids is None else replace(request, token_ids=None), offset, chain)


def _read_again(read: _Read, path: str | Path, tokenize: Tokenize | None) -> None:
    """The chains read again from their lines, in arrival order, into a new block index."""
    read.index = BlockIndex(read.block_size, read.index.references is not None)
    chains = _Chains(read.index)
    arrivals = np.frombuffer(read.table.arrivals_s, np.float64)
    lines = np.frombuffer(read.table.lines, np.int64)
    chained = np.frombuffer(read.chain_rows, np.int32)
    where = np.frombuffer(read.chain_offsets, np.int64)[np.lexsort((lines[chained], arrivals[chained]))]
    rows = chained[np.lexsort((lines[chained], arrivals[chained]))]
    with open(path, "rb") as file:
        for start in range(0, len(rows), CHUNK):
            part = rows[start : start + CHUNK]
            texts: list[tuple[int, str | None, None]] = []
            items: list[_Held | None] = []
            for row, offset in zip(part, where[start : start + CHUNK]):
                file.seek(int(offset))
                raw = file.readline().rstrip(b"\n")
                request, hash_ids, prompt, _, _ = read_line(int(lines[row]), raw, read.fmt, tokenize is not None)
                if hash_ids is not None:
                    chain = (request.input_tokens, MOONCAKE_UNIT, id_array(hash_ids), True)
                    items.append((request.arrival_s, request.line, row, *chain))
                else:
                    texts.append((len(items), prompt, None))
                    items.append(None)
            if texts and tokenize is not None:
                for (i, _, _), ids in zip(texts, tokenize([p or "" for _, p, _ in texts])):
                    row = part[i]
                    items[i] = (arrivals[row], int(lines[row]), row, *_prompt_chain(ids, read.block_size))
            for item in items:
                assert item is not None  # a chain of hash ids or tokenized text, each line good before
                chains.hold(item)
    chains.finish()


def profile_stream(
    path: str | Path,
    fmt: str = "auto",
    tokenize: Tokenize | None = None,
    level: str | None = None,
    columns: ColumnMap | None = None,
    block_size: int = 16,
    reuse_distance: bool = False,
) -> TrafficProfile:
    """The profile of the log or trace at ``path``, read once as a stream (module docstring):
    kvplan.profile.stats.profile_log of kvplan.profile.csv_traces.read_trace's read, in bounded memory.
    With ``reuse_distance``, ``data["reuse_distance"]`` is kvplan.sizing.reuse_distance.reuse_summary
    of the prefix units in arrival order (each chain's in chain order; a unit's tokens: 512 for a
    Mooncake hash id, ``block_size`` for a tokenized block), memory then growing with the units.

    Raises:
        KvplanError: what kvplan.profile.csv_traces.read_trace raises.
    """
    if columns is not None and fmt not in ("auto", "mapped"):
        raise KvplanError("columns", f"names a trace's columns itself; it cannot go with `log_format` {fmt}")
    if fmt == "mapped" and columns is None:
        raise KvplanError("log_format", "mapped reads the columns `columns` names, and none was given", EXAMPLE)
    source = str(path)
    kind = csv_traces.sniff(path) if fmt in ("auto", "mapped") else ("csv" if fmt in csv_traces.KNOWN else "jsonl")
    read = _Read(source, fmt, level, block_size, reuse_distance)
    name: str | None = None
    if kind == "jsonl" and columns is None:
        chunk: list[tuple[int, int, bytes]] = []
        for line in file_lines(path, "JSONL"):
            chunk.append(line)
            if len(chunk) >= CHUNK:
                _jsonl_chunk(read, chunk, tokenize)
                chunk = []
        _jsonl_chunk(read, chunk, tokenize)
    else:
        lines = file_lines(path, "CSV or JSONL")
        header: list[str] = []
        spec: ColumnMap
        if kind == "csv":
            header, name, spec = csv_traces.csv_header(*next(lines)[::2], fmt, columns, source)
        else:
            assert columns is not None  # a JSONL log read by its columns
            name, spec = "mapped", columns
        for n, offset, raw in lines:
            try:
                request = (
                    csv_traces.csv_row(n, raw, header, spec, name)
                    if kind == "csv"
                    else csv_traces.mapped_row(n, raw, spec)
                )
            except _Bad as err:
                read.bad(n, err)
                continue
            if csv_traces.failed(name, request):
                read.num_failed += 1
                read.first_failed = read.first_failed or n
            else:
                read.add(request, offset, None)
    return _profile(read, path, tokenize, name)


def _profile(read: _Read, path: str | Path, tokenize: Tokenize | None, name: str | None) -> TrafficProfile:
    source = read.source
    if not read.num_good:
        first = read.bad_shown[0] if read.bad_shown else None
        if name is None:
            assert first is not None  # file_lines raised on a log without a line
            raise KvplanError(f"line {first.line}: {first.field}", first.problem, source=source)
        raise csv_traces.no_good_row(source, first, read.first_failed, read.num_failed)
    levels = tuple(read.levels)
    check_level(read.level, levels, source)
    read.chains.finish()
    if not read.chains.in_order:
        _read_again(read, path, tokenize)
    order = read.table.arrival_order()
    columns = read.table.columns(order)
    prefix = read.index.prefix_stats(len(read.table), order, columns.input_tokens, columns.cached_tokens)
    read.table = RequestTable()  # its rows are in the columns now
    if name is not None:
        notes = csv_traces.csv_notes(name, read.num_failed)
    else:
        notes = (left_out_note(read.left_out),) if read.left_out else ()
        name = read.fmt if read.fmt != "auto" else read.first_format
    profile = build_profile(
        columns,
        prefix,
        source=source,
        num_bad_lines=read.num_bad,
        bad_lines=[b.describe() for b in read.bad_shown],
        block_size=read.block_size,
        log_format=name,
        num_failed=read.num_failed,
        level=(read.kept if read.level != "all" else "all") if levels else None,
        levels=levels,
        notes=notes,
    )
    if read.index.references is not None:
        from kvplan.sizing.reuse_distance import reuse_summary

        parts = read.index.references or [(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))]
        ids, tokens, arrivals = (np.concatenate(c) for c in zip(*parts))
        profile.data["reuse_distance"] = reuse_summary(ids, tokens, arrivals)
    return profile
