"""The raw records of a run and the key of a load level: what is written as it happens.

A run folder holds one ``RequestRecord`` per finished request (``requests.jsonl``) and one
``StepRecord`` per engine step (``steps.jsonl``), each tagged with its load level. Every view,
summary and gate verdict is computed from these and the run result (kvplan.results.run_result).
Times are seconds on the run's clock (``time.perf_counter()`` for a measured run, the virtual
clock of a simulated one); only differences are meaningful.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from operator import attrgetter, itemgetter
from typing import Any, Literal

from engine.frozen import fast_init

Mode = Literal["closed", "open"]


@dataclass(frozen=True)
class LevelKey:
    """One load level of one bucket: the one key and the one label every part uses.

    ``value`` is the concurrency N (mode ``closed``: N requests in flight) or the request rate in
    requests/s (mode ``open``: Poisson arrivals). ``variant`` is "" or, in a shared_prefix run,
    ``cached`` / ``uncached`` (kvplan.results.stats.prefix_metrics).
    """

    bucket: str
    mode: Mode
    value: int | float
    variant: str = ""

    @property
    def label(self) -> str:
        """``c=8``, ``2 req/s``, ``c=8 cached``: the level within its bucket (tables, the gate's
        baseline keys, charts)."""
        label = f"c={int(self.value)}" if self.mode == "closed" else f"{self.value:g} req/s"
        return f"{label} {self.variant}" if self.variant else label

    @property
    def name(self) -> str:
        """``short c=8``: bucket and label (progress bars, chart annotations)."""
        return f"{self.bucket} {self.label}"

    @functools.cached_property
    def id(self) -> str:
        """``short/closed/8`` (``/cached``): the stem of request ids and cache salts, unique per level
        (made once per key: every request of a level names it)."""
        return f"{self.bucket}/{self.mode}/{self.value:g}" + (f"/{self.variant}" if self.variant else "")

    @classmethod
    def of(cls, record: Any) -> LevelKey:
        """The key of anything that carries ``bucket, mode, level, variant`` (records, summaries)."""
        return cls(record.bucket, record.mode, record.level, record.variant)


@fast_init  # built once a step or request (engine.frozen)
@dataclass(frozen=True)
class RequestRecord:
    """One finished request of one load level.

    ``level`` is the level's value (concurrency, or requests/s). ``token_times[i]`` is when output
    token i reached the client (the engine's step end; for an HTTP target the chunk's arrival).
    ``finish_reason``: stop, length, abort, oom, cannot_fit (the engine's), or error (a target's
    failed request, ``finish_detail`` says why). Latencies derived from these: kvplan.results.metrics.
    For an HTTP target, ``sent_time`` is when the client sent the request (``arrival_time`` is
    its scheduled arrival) and ``output_tokens_source`` where ``num_output_tokens`` came from:
    ``usage`` (the server's count), ``tokenizer`` (the text tokenized) or ``chunks`` (one token
    per chunk carrying text); a chunk carrying k tokens puts k equal times in ``token_times``.
    """

    request_id: str
    bucket: str
    mode: str
    level: int | float
    arrival_time: float
    first_scheduled_time: float | None
    finish_time: float
    token_times: tuple[float, ...]
    num_prompt_tokens: int
    num_output_tokens: int
    max_tokens: int
    finish_reason: str
    finish_detail: str = ""
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    variant: str = ""  # "cached" | "uncached" in a shared_prefix run (see kvplan.results.stats.prefix_metrics)
    prefix_group: int | None = None  # the shared prefix it carried; None: none
    tenant: int | None = None
    cache_salt: str | None = None  # requests share prefix blocks only under the same salt
    sent_time: float | None = None
    output_tokens_source: str = ""
    request_class: str = ""  # the bucket's mix class it was drawn from; "" without a mix
    session: int | None = None  # a multi-turn session's index in its bucket; None: a single request
    turn: int | None = None  # its turn in that session, 1-based
    # an HTTP target whose stream carried reasoning: when its first answer chunk (content, not
    # reasoning text) arrived, the end of TTFO; None when the stream carried no reasoning
    first_output_time: float | None = None
    tenant_name: str | None = None  # the tenant admission counted it under (kvplan.workload.admission); None: none
    # a disaggregated deployment: seconds the prompt's KV took to move from its prefill worker to its
    # decode worker (admission to arrival, setup included); None: served aggregated
    kv_transfer_s: float | None = None
    # when the load driver handed the request to its backend, on the run's clock (at or after
    # arrival_time; an HTTP target's then goes out at sent_time); what lets a replayed simulation
    # submit it before the same step (kvplan.run.sim.replay); None in runs recorded before it existed
    submit_time: float | None = None

    @property
    def key(self) -> LevelKey:
        return LevelKey.of(self)


@fast_init  # built once a step or request (engine.frozen)
@dataclass(frozen=True)
class StepRecord:
    """One engine step (its ``StepStats``, field for field) with its level and four KV sizes.

    ``step_index`` counts the steps of the engine that ran it: each engine variant (``variant``) is
    an engine of its own whose indices start again, so (variant, step_index) names a step of a run.

    ``kv_resident_tokens``: per request holding blocks after the step, its tokens with K/V;
    ``kv_resident_request_ids`` names those requests in the same order.
    ``ideal_bytes`` = sum(resident tokens) x bytes per token; ``paged_bytes`` = sum of whole
    blocks per request x bytes per block; ``contiguous_bytes`` = requests holding KV x
    max_model_len x bytes per token (kvplan's estimate, all three); ``measured_bytes`` = used
    blocks x the engine's real bytes per block. ``num_prefill_seqs``, ``num_context_tokens``,
    ``num_attended_tokens`` and ``num_decode_context_tokens``: the work the step ran
    (engine.outputs.StepStats), what a step-time model is fitted on; 0 in runs recorded before
    they existed.
    """

    step_index: int
    bucket: str
    mode: str
    level: int | float
    start_time: float
    end_time: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_used_blocks: int
    num_free_blocks: int
    num_total_blocks: int
    num_preemptions: int
    num_finished: int
    num_oom: int
    num_prefix_queried_tokens: int
    num_prefix_hit_tokens: int
    kv_resident_tokens: tuple[int, ...]
    ideal_bytes: int
    paged_bytes: int
    contiguous_bytes: int
    measured_bytes: int
    variant: str = ""  # the level's variant, as in RequestRecord
    kv_resident_request_ids: tuple[str, ...] = ()
    num_peak_used_blocks: int | None = None  # blocks held during the step; None in older runs
    num_prefill_seqs: int = 0
    num_context_tokens: int = 0
    num_attended_tokens: int = 0
    num_decode_context_tokens: int = 0
    # admission on: the tenants with requests queued or running after the step, and each one's
    # running and waiting requests (engine.outputs.StepStats); () otherwise
    tenant_ids: tuple[str, ...] = ()
    tenant_num_running: tuple[int, ...] = ()
    tenant_num_waiting: tuple[int, ...] = ()
    # offload tiers on (engine.offload; engine.outputs.StepStats' fields of the same names): blocks
    # stored into and loaded from each lower tier, hit tokens each served, bytes moved, blocks held
    num_host_stores: int = 0
    num_disk_stores: int = 0
    num_host_loads: int = 0
    num_disk_loads: int = 0
    num_host_hit_tokens: int = 0
    num_disk_hit_tokens: int = 0
    offload_bytes_stored: int = 0
    offload_bytes_loaded: int = 0
    num_host_blocks: int = 0
    num_disk_blocks: int = 0

    @property
    def key(self) -> LevelKey:
        return LevelKey.of(self)

    @classmethod
    def from_stats(cls, key: LevelKey, stats: Any, **sizes: int) -> StepRecord:
        """A record of one step: ``stats`` is anything with StepStats' field names (the engine's,
        or a simulated step's); ``sizes`` are the four KV sizes in bytes."""
        return step_record(step_values(key, stats, sizes))


def step_values(key: LevelKey, stats: Any, sizes: Mapping[str, int]) -> tuple:
    """``StepRecord.from_stats(key, stats, **sizes)``'s field values, in field order (a tuple; what
    a simulation's writer keeps, kvplan.results.rows.StepRows).

    Raises:
        AttributeError: ``stats`` lacks a StepRecord field that neither the key nor ``sizes`` gives.
    """
    own = (key.bucket, key.mode, key.value, key.variant, *sizes.values())
    from_stats, layout = _stats_layout(StepRecord, ("bucket", "mode", "level", "variant", *sizes))
    return layout((*from_stats(stats), *own))


def step_record(values: Sequence[Any]) -> StepRecord:
    """The StepRecord of ``values`` (every field, in field order), as ``StepRecord(*values)`` builds it.

    A long simulation builds a million of them: the frozen dataclass's __init__ sets each of its
    50 fields through object.__setattr__ (6 us a record); the record is the same with its
    __dict__ filled at once (StepRecord has no __post_init__; copy.copy builds records so too).
    """
    record = object.__new__(StepRecord)
    record.__dict__.update(zip(_field_names(StepRecord), values))
    return record


def request_record(values: Mapping[str, Any]) -> RequestRecord:
    """``RequestRecord(**values)`` made as ``step_record`` makes a StepRecord: its defaults, then
    ``values`` (which must name every field without a default, and only fields), put in its
    __dict__ at once (the frozen dataclass's __init__ sets its 28 fields one by one; a search
    probe records thousands of requests, and those records were a fifth of its time)."""
    record = object.__new__(RequestRecord)
    record.__dict__.update(_REQUEST_DEFAULTS)
    record.__dict__.update(values)
    return record


def field_names(record_type: type) -> tuple[str, ...]:
    """A record dataclass's field names, in order (read once per type: records are written by the
    thousand)."""
    # Called through a plain ``type`` parameter: mypy does not see a ``type[X]`` argument as the
    # Hashable that functools.cache asks for, though every class object is hashable.
    return _field_names(record_type)


@functools.cache
def _field_names(record_type: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(record_type))


@functools.cache
def _stats_layout(record_type: type, own: tuple[str, ...]) -> tuple[Callable[[Any], Any], Callable[[tuple], Any]]:
    """For ``StepRecord.from_stats`` with ``own`` names given: what reads the other fields from the
    stats (one attrgetter, in field order; AttributeError naming one it lacks), and what puts
    those values followed by ``own``'s into field order (itemgetter)."""
    names = _field_names(record_type)
    mine = [n for n in names if n not in own]
    read = attrgetter(*mine) if len(mine) > 1 else (lambda stats: (getattr(stats, mine[0]),) if mine else ())
    at = {name: i for i, name in enumerate([*mine, *own])}
    return read, itemgetter(*(at[n] for n in names))


_REQUEST_DEFAULTS = {f.name: f.default for f in fields(RequestRecord) if f.default is not MISSING}


def level_fields(key: LevelKey) -> dict[str, Any]:
    """The level columns of a record: ``bucket, mode, level, variant``."""
    return {"bucket": key.bucket, "mode": key.mode, "level": key.value, "variant": key.variant}
