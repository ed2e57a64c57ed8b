"""Trace replay: a trace's lines as the requests of its one open-loop level, prompts built from their
hash blocks (the format, the hash-block expansion and the level's timing: kvplan.workload.trace)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import lru_cache
from hashlib import shake_128
from typing import overload

import numpy as np

from kvplan.traffic.requests import SampledBuckets, SampledRequest
from kvplan.workload.schema import Workload
from kvplan.workload.trace import PROBE_REQUESTS, Trace, clipped, read_trace

RECIPE_BITS = 64  # the least bits of draws an engine block needs for its hash from the recipe


class TracePrompt(Sequence[int]):
    """A trace line's prompt token ids, built when read (module docstring of kvplan.workload.trace:
    block ``key`` expands to ``block_tokens`` ids from ``numpy.random.default_rng([seed, *key])``).

    Holding the recipe instead of the ids keeps a replay's memory bounded by the requests in
    flight, not by the trace's tokens (issue 38: 43.6 M ids of a 20,000-request trace took 2 GB as
    Python ints), and lets a replay start before any prompt is built. ``len`` costs nothing; reading
    ids builds them (a few blocks' draws, the last 4,096 blocks kept); the driver takes the tuple
    once per sent request. Two prompts with the same recipe are equal; one equals any sequence of
    the same ids.
    """

    __slots__ = ("_recipe",)

    def __init__(
        self, seed: int, vocab_size: int, block_tokens: int, line: int, hash_ids: tuple[int, ...] | None, length: int
    ):
        if hash_ids is not None:  # the ids alone name the blocks: equal recipes for equal prompts
            count = -(-length // block_tokens)
            line, hash_ids = 0, hash_ids if len(hash_ids) == count else hash_ids[:count]
        self._recipe = (seed, vocab_size, block_tokens, line, hash_ids, length)

    def ids(self) -> tuple[int, ...]:
        """The token ids, a tuple of ``len(self)`` Python ints in [0, vocab_size)."""
        return self.ids_between(0, self._recipe[5])

    def ids_between(self, start: int, stop: int) -> tuple[int, ...]:
        """``ids()[start:stop]`` (0 <= start <= stop <= len), drawing only the blocks it covers."""
        seed, vocab, size, line, hash_ids, _ = self._recipe
        if start >= stop:
            return ()
        first, end = start // size, -(-stop // size)
        offset = first * size
        if end - first == 1:  # within one block (a simulation's reads: a first block, a prompt's tail)
            key = (1, line, first) if hash_ids is None else (0, hash_ids[first])
            return _span(seed, vocab, size, key, start - offset, stop - offset)
        if hash_ids is None:  # the line's own blocks, shared with nothing
            keys: list[tuple[int, ...]] = [(1, line, b) for b in range(first, end)]
        else:
            keys = [(0, h) for h in hash_ids[first:end]]
        parts = [_block(seed, vocab, size, key) for key in keys]
        return tuple(np.concatenate(parts)[start - offset : stop - offset].tolist())  # Python ints, in C

    def tokens(self) -> TraceTokens:
        """The ids as a simulated engine's request holds them (``TraceTokens``): nothing drawn until
        a part of them is read."""
        return TraceTokens(self, 0, len(self))

    def block_hashes(self, block_size: int, salt: str | None, count: int) -> list[bytes] | None:
        """The prefix-cache hashes of the prompt's first ``count`` full blocks of ``block_size``
        tokens (at most ``len // block_size``) under ``salt``, from the recipe alone (no token is
        built; the engine's Request.prompt_hashes): 16 bytes each, chained as the engine chains
        block hashes (a block's hash covers the salt and every block before it). Trace block ``t``
        (key ``k_t``, as ``ids`` draws it) gives its ``block_tokens / block_size`` blocks from one
        ``shake_128(parent + recipe + k_t)`` output, 16 bytes a block (``parent``: the previous
        block's hash; block 0's covers the salt), so a shorter prompt's blocks are a prefix of a
        longer one's. Two trace prompts' blocks hash alike exactly where they draw the same trace
        blocks in the same order under the same salt, which is where their tokens agree: an engine
        block holds ``block_size`` uniform draws from ``vocab_size`` ids, at least
        ``RECIPE_BITS`` bits of them, so two distinct ones agree with a chance below 2**-64 (the
        ids' own hash is 128-bit blake2b). These are not the hashes of the tokens
        (engine.block_hash), so a run's requests all take theirs from here. None (the tokens are
        hashed) where ``block_size`` does not divide ``block_tokens`` (an engine block would span
        two trace blocks) or its draws hold fewer bits (a small vocabulary or block, where
        distinct blocks' ids can agree and hit in the prefix cache)."""
        seed, vocab, size, line, hash_ids, length = self._recipe
        if size % block_size or block_size * math.log2(max(vocab, 1)) < RECIPE_BITS:
            return None
        per, full = size // block_size, min(count, length // block_size)
        recipe = f"{seed}/{vocab}/{size}/".encode()
        parent = b"salt:" + (b"" if salt is None else b"\x01" + salt.encode()) + b"\x00"
        hashes: list[bytes] = []
        for t in range(-(-full // per)):
            key = (1, line, t) if hash_ids is None else (0, hash_ids[t])
            num = min(per, full - t * per)
            out = shake_128(parent + recipe + repr(key).encode()).digest(16 * num)
            hashes += [out[i : i + 16] for i in range(0, 16 * num, 16)]
            parent = hashes[-1]
        return hashes

    def __len__(self) -> int:
        return self._recipe[5]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids())

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...

    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        return self.ids()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TracePrompt):
            return self._recipe == other._recipe
        return isinstance(other, Sequence) and len(other) == len(self) and tuple(other) == self.ids()

    def __hash__(self) -> int:
        return hash(self._recipe)

    def __repr__(self) -> str:
        return f"TracePrompt(line={self._recipe[3]}, len={len(self)})"


class TraceTokens(Sequence[int]):
    """Token ids ``start``..``stop - 1`` of a ``TracePrompt``, drawn only where read: a slice is
    another view (a simulated scheduler slices every prompt into its steps and never reads the
    ids), an index or an iteration draws the blocks it covers, ``+`` gives a tuple. Equal to,
    and hashing as, the tuple of its ids (so a set or dict mixes them with tuples)."""

    __slots__ = ("prompt", "start", "stop")

    def __init__(self, prompt: TracePrompt, start: int, stop: int):
        self.prompt, self.start, self.stop = prompt, start, stop

    def ids(self) -> tuple[int, ...]:
        return self.prompt.ids_between(self.start, self.stop)

    def __len__(self) -> int:
        return self.stop - self.start

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> TraceTokens: ...

    def __getitem__(self, index: int | slice) -> int | TraceTokens:
        if isinstance(index, slice):
            begin, end, step = index.indices(len(self))
            if step != 1:
                raise ValueError("TraceTokens: only contiguous slices (step 1)")
            return TraceTokens(self.prompt, self.start + begin, self.start + max(begin, end))
        at = index + len(self) if index < 0 else index
        if not 0 <= at < len(self):
            raise IndexError("TraceTokens index out of range")
        return self.prompt.ids_between(self.start + at, self.start + at + 1)[0]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids())

    def __add__(self, other: Sequence[int]) -> tuple[int, ...]:
        return self.ids() + tuple(other)

    def __radd__(self, other: Sequence[int]) -> tuple[int, ...]:
        return tuple(other) + self.ids()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and tuple(other) == self.ids()

    def __hash__(self) -> int:
        return hash(self.ids())

    def __repr__(self) -> str:
        return f"TraceTokens({self.prompt!r}, {self.start}:{self.stop})"


@lru_cache(maxsize=1024)
def _span(seed: int, vocab_size: int, size: int, key: tuple[int, ...], start: int, stop: int) -> tuple[int, ...]:
    """Ids ``start``..``stop - 1`` of one hash block's (``_block``), as Python ints."""
    return tuple(_block(seed, vocab_size, size, key)[start:stop].tolist())


@lru_cache(maxsize=4096)
def _block(seed: int, vocab_size: int, size: int, key: tuple[int, ...]) -> np.ndarray:
    """One hash block's ``size`` token ids (int64), drawn from ``default_rng([seed, *key])``."""
    return np.random.default_rng([seed, *key]).integers(0, vocab_size, size=size)


def trace_requests(workload: Workload, trace: Trace, vocab_size: int, picked: Sequence[int]) -> list[SampledRequest]:
    """The requests of the trace's lines at 0-based positions ``picked`` (in that order), prompts
    built from their hash blocks (module docstring) when they are read (``TracePrompt``): a line's
    request is the same whichever other lines are picked beside it, since every block is drawn from
    its own seed. vocab_size: token ids lie in [0, vocab_size)."""
    dataset, seed = workload.dataset, workload.seed
    size = dataset.block_tokens
    requests = []
    for i in picked:
        r = trace.requests[i]
        length = clipped(r.input_length, dataset.max_input_tokens)
        prompt = TracePrompt(seed, vocab_size, size, r.line, r.hash_ids, length)
        out = clipped(r.output_length, dataset.max_output_tokens)
        requests.append(SampledRequest(prompt, out, f"trace:{r.line}"))
    return requests


def sample_trace(workload: Workload, vocab_size: int) -> SampledBuckets:
    """Every bucket's requests: the trace's lines in order (``trace_requests``), the same list for
    each bucket. vocab_size: token ids lie in [0, vocab_size)."""
    trace = read_trace(workload)
    assert trace is not None  # a trace workload
    requests = trace_requests(workload, trace, vocab_size, range(len(trace.requests)))
    # what the knee and SLO search probes run (kvplan.run.sim.trace_sample): a sample of at most this many
    probe = min(len(requests), PROBE_REQUESTS)
    info = {"kind": "trace", "path": str(workload.dataset_path), "num_lines": len(requests), "probe_requests": probe}
    return SampledBuckets({b.name: list(requests) for b in workload.buckets}, info)
