"""Trace replay: a trace's lines as the requests of its one open-loop level, prompts built from their
hash blocks (the format, the hash-block expansion and the level's timing: kvplan.workload.trace)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvplan.traffic.requests import SampledBuckets, SampledRequest
from kvplan.workload.schema import Workload
from kvplan.workload.trace import PROBE_REQUESTS, Trace, clipped, read_trace


def trace_requests(workload: Workload, trace: Trace, vocab_size: int, picked: Sequence[int]) -> list[SampledRequest]:
    """The requests of the trace's lines at 0-based positions ``picked`` (in that order), prompts
    built from their hash blocks (module docstring): a line's request is the same whichever other
    lines are picked beside it, since every block is drawn from its own seed. vocab_size: token ids
    lie in [0, vocab_size)."""
    dataset, seed = workload.dataset, workload.seed
    size = dataset.block_tokens
    shared: dict[int, np.ndarray] = {}

    def block(*key: int) -> np.ndarray:
        return np.random.default_rng([seed, *key]).integers(0, vocab_size, size=size)

    requests = []
    for i in picked:
        r = trace.requests[i]
        length = clipped(r.input_length, dataset.max_input_tokens)
        count = -(-length // size)
        if r.hash_ids is None:  # the line's own blocks, shared with nothing
            parts = [block(1, r.line, b) for b in range(count)]
        else:
            parts = [shared[h] if h in shared else shared.setdefault(h, block(0, h)) for h in r.hash_ids[:count]]
        ids = np.concatenate(parts)[:length]
        out = clipped(r.output_length, dataset.max_output_tokens)
        requests.append(SampledRequest(tuple(ids.tolist()), out, f"trace:{r.line}"))  # Python ints, in C
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
