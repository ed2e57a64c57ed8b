"""The level driver: closed-loop and open-loop load over any backend, every record written as it happens.

Closed loop (``concurrency: N``): N requests in flight; a finished one is replaced at once.
Open loop (``request_rates: r``): arrivals at r requests/s on the backend's clock, by the bucket's
``arrival:`` process (Poisson by default, gamma or constant, optionally ramped up;
kvplan.workload.arrivals); each request's arrival_time is its scheduled arrival, so queueing before
admission counts in its TTFT.
Every level replays the bucket's same requests with its own cache salt, so levels differ only in
load and never hit each other's prefix-cache blocks. A steady-state level (kvplan.results.stats.steady)
sends warm-up requests before the measured ones and cool-down requests after them, or sends for
``duration_s`` seconds, cycling the bucket's requests: request ``i`` is the bucket's
``i % num_requests``, and from the second round on its salt names the round, so a request never
hits the blocks of its own earlier round. A ``shared_prefix`` workload runs each level
twice, variant ``cached`` (one salt per tenant: a group's requests share prefix blocks) then
``uncached`` (one salt per request: nothing shared). A level of multi-turn sessions
(``dataset.sessions``) runs its sessions as users who wait for each reply (kvplan.run.session_loop).

A backend is where the requests run (the in-process engine, a simulated scheduler on a cost-model
clock, a remote server); the driver asks it only for its clock, to take a request, to make
progress, and to idle::

    driver --Submission--> backend.submit()
    driver <--([Finished], [step stats])-- backend.advance(until)   one engine step, or until a
                                                                      request finishes or `until`
    driver --> Recorder --> RequestRecord / StepRecord --> requests.jsonl / steps.jsonl
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import numpy as np

from engine.frozen import fast_init
from kvplan.results.records import LevelKey, Mode, RequestRecord, StepRecord, field_names, level_fields, request_record
from kvplan.results.stats.prefix_metrics import CACHED, UNCACHED, VARIANTS
from kvplan.results.stats.steady import LevelSchedule
from kvplan.results.stats.variants import alone_variant
from kvplan.run.session_loop import run_sessions
from kvplan.traffic.requests import SampledRequest
from kvplan.workload.arrivals import Arrival, ArrivalOffsets
from kvplan.workload.buckets import Bucket
from kvplan.workload.schema import Workload
from kvplan.workload.trace import read_trace
from kvplan.workload.variants import variants_of


@dataclass(frozen=True)
class Level:
    """One load level of one bucket, with the bucket's requests (replayed at every level)."""

    key: LevelKey
    bucket_index: int
    requests: tuple[SampledRequest, ...]
    plan: LevelSchedule | None = None  # None: each of ``requests`` once, all measured
    arrival: Arrival | None = None  # the bucket's open-loop arrival process; None: Poisson
    load: float | None = None  # the concurrency or rate it runs at, when not key.value (a class alone)
    offsets: tuple[float, ...] | None = None  # a trace's arrivals, s from the level's start; None: drawn

    @property
    def value(self) -> float:
        """The concurrency (closed loop) or request rate (open loop) the level runs at."""
        return self.key.value if self.load is None else self.load


def schedule_levels(
    workload: Workload, sampled: dict[str, list[SampledRequest]], interference: bool = False
) -> list[Level]:
    """Bucket by bucket: closed-loop levels in ascending concurrency, then open-loop rates. Each
    level runs once per variant in a row: a shared_prefix workload's cached then uncached (a
    slower first level, while the process warms up, then counts against caching), or the
    bucket's engine variants (kvplan.workload.variants) in their order. A mix bucket with
    ``interference`` (or any mix with ``interference=True``: a simulation) follows each mixed
    level with each class alone at its share of the load (``_alone``)."""
    levels = []
    trace = read_trace(workload)  # a trace bucket: one open level at the trace's mean rate (kvplan.workload.trace)
    for i, bucket in enumerate(workload.buckets):
        reqs = tuple(sampled[bucket.name])
        if bucket.concurrency == "auto":
            raise ValueError(f"buckets[{i}].concurrency: auto is resolved before the levels are planned")
        if workload.shared_prefix is not None:
            variants: Sequence[str] = VARIANTS
        else:
            variants = [v.name for v in variants_of(workload, i)] or [""]
        modes: tuple[tuple[Mode, Sequence[float]], ...] = (
            ("closed", bucket.concurrency),
            ("open", bucket.request_rates if trace is None else [trace.mean_rate]),
        )
        for mode, values in modes:
            for x in sorted(values):
                plan = None if bucket.level_plan.is_plain else bucket.level_plan.at(x)
                for v in variants:
                    level = Level(
                        LevelKey(bucket.name, mode, x if mode == "closed" else float(x), v),
                        i,
                        reqs,
                        plan,
                        bucket.arrival,
                        offsets=None if trace is None else trace.offsets,
                    )
                    levels.append(level)
                    if bucket.mix is not None and (interference or bucket.interference):
                        levels += _alone(level, bucket)
    return levels


def _alone(level: Level, bucket: Bucket) -> list[Level]:
    """Each class of a mixed level alone, on its own requests of the level's stream, at its share
    of the load (weight / sum of weights): concurrency N x share rounded (at least 1), or rate x
    share; each of those requests once."""
    total = sum(c.weight for c in bucket.classes)
    out = []
    for c in bucket.classes:
        own = tuple(r for r in level.requests if r.request_class == c.name)
        if not own:
            continue
        share = c.weight / total
        load = max(1, round(level.key.value * share)) if level.key.mode == "closed" else level.key.value * share
        key = replace(level.key, variant=alone_variant(level.key.variant, c.name))
        out.append(replace(level, key=key, requests=own, plan=None, load=load))
    return out


def cache_salt(key: LevelKey, index: int, request: SampledRequest) -> str:
    """Unique per request in the uncached variant (nothing shared), one per tenant in the
    cached one, else the level's own (levels never hit each other's blocks)."""
    if key.variant == UNCACHED:
        return f"{key.id}/{index}"
    if key.variant == CACHED and request.tenant is not None:
        return f"{key.id}/tenant{request.tenant}"
    return key.id


def round_salt(salt: str, index: int, num_requests: int) -> str:
    """``salt`` for the ``index``-th request of a level that cycles ``num_requests`` requests:
    unchanged in the first round, with the round appended after it."""
    rounds = index // num_requests
    return salt if rounds == 0 else f"{salt}/round{rounds}"


# ---- what crosses the backend boundary ----------------------------------------------------------
@fast_init  # built once a step or request (engine.frozen)
@dataclass(frozen=True)
class Submission:
    """A request for a backend: run ``prompt_token_ids`` for exactly ``max_tokens`` output tokens
    (ignore_eos), sampling seeded by ``seed``, under ``cache_salt``. ``arrival_time``: its
    scheduled arrival on the backend's clock (open loop), None for now (closed loop).
    ``output_token_ids``: the output to emit instead of sampled tokens (a session turn's recorded
    reply, engine.request.SamplingParams.forced_token_ids), where the backend can; None: sampled.
    ``tenant``: who sends it (SampledRequest.admission_tenant), for admission's per-tenant limits.
    ``prompt_hashes``: a simulated backend's source of the prompt's block hashes
    (engine.request.Request.prompt_hashes: a trace prompt's recipe); a server ignores it."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    seed: int
    cache_salt: str
    arrival_time: float | None = None
    output_token_ids: tuple[int, ...] | None = None
    tenant: str | None = None
    prompt_hashes: Callable[[int, str | None, int], list[bytes] | None] | None = None


@fast_init  # built once a step or request (engine.frozen)
@dataclass(frozen=True)
class Finished:
    """A finished request as a backend reports it; times on the backend's clock (seconds).
    ``token_times[i]``: when output token i reached the client."""

    request_id: str
    arrival_time: float
    first_scheduled_time: float | None
    finish_time: float
    token_times: tuple[float, ...]
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str
    finish_detail: str = ""
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    sent_time: float | None = None  # an HTTP target: when the request went out
    output_tokens_source: str = ""  # an HTTP target: usage | tokenizer | chunks
    first_output_time: float | None = None  # an HTTP target: its first answer (non-reasoning) chunk
    kv_transfer_s: float | None = None  # disaggregated: seconds its prompt's KV took to move (None: not)


class RunStopped(Exception):
    """A backend cannot go on (a remote server stopped answering): the run stops, keeping what
    finished. ``str(err)`` says why."""


class Backend(Protocol):
    """Where a level's requests run (see the module docstring). ``advance`` may raise
    RunStopped."""

    def now(self) -> float:
        """The backend's clock, seconds."""

    def submit(self, submission: Submission) -> None:
        """Take one request."""

    def advance(self, until: float | None) -> tuple[list[Finished], Sequence[Any]]:
        """Make progress while requests are in flight: requests finished since the last call, and
        the steps run (objects with ``engine.outputs.StepStats``' fields, in a list or a decode
        run's ``engine.outputs.DecodeRunSteps``; [] for a backend without steps). May return
        early at ``until`` (the next scheduled arrival) with nothing finished."""

    def wait_until(self, when: float) -> None:
        """Nothing is in flight: idle until the clock reads ``when``."""


# ---- records ------------------------------------------------------------------------------------
class RecordWriter(Protocol):
    """Where a Recorder writes its records: kvplan.results.writing.run_writer.RunWriter (the run's JSONL
    files), or memory (a simulated probe)."""

    def write_request(self, record: RequestRecord) -> None: ...

    def write_step(self, record: StepRecord) -> None: ...


class Recorder:
    """Turns a level's finished requests and steps into records, writes them, counts progress.

    ``kv_sizes``: a step's stats -> its four KV sizes in bytes (ideal, paged, contiguous,
    measured; kvplan.run.estimate.KVPricing.step_bytes). ``advance(finished, in_flight)`` is
    called per finished request (progress).
    """

    def __init__(
        self,
        writer: RecordWriter,
        level: Level,
        kv_sizes: Callable[[Any], dict[str, int]],
        advance: Callable[..., None] = lambda *args: None,
    ):
        self.writer, self.level, self.kv_sizes, self.advance = writer, level, kv_sizes, advance
        # a decode run's sizes as columns (kvplan.run.estimate.KVPricing.run_bytes, where kv_sizes is
        # its step_bytes) for a writer that takes a run at once (kvplan.results.writing.run_writer.RunWriter)
        run_bytes = getattr(getattr(kv_sizes, "__self__", None), "run_bytes", None)
        write_run = getattr(writer, "write_decode_run", None)
        self._write_run = (lambda key, run: write_run(key, run, run_bytes(run))) if run_bytes and write_run else None
        # request id -> (request, cache salt, when the driver submitted it on the backend's clock)
        self.submitted: dict[str, tuple[SampledRequest, str, float]] = {}

    def record(self, finished: list[Finished], steps: Sequence[Any]) -> None:
        key = self.level.key
        # a RunWriter takes the stats as they are, without a StepRecord built for each (a million)
        write_stats = getattr(self.writer, "write_step_stats", None)
        if self._write_run is not None and hasattr(
            steps, "taken_steps"
        ):  # a decode run (engine.outputs.DecodeRunSteps)
            self._write_run(key, steps)
            steps = ()
        for stats in steps:
            if write_stats is not None:
                write_stats(key, stats, self.kv_sizes(stats))
            else:
                self.writer.write_step(StepRecord.from_stats(key, stats, **self.kv_sizes(stats)))
        level = level_fields(key) if finished else {}
        for out in finished:
            req, salt, submitted_at = self.submitted.pop(out.request_id)
            # a Finished's __dict__ is its fields, each a RequestRecord's (tests/kvplan/results/test_record_lines.py)
            done = out.__dict__ if type(out) is Finished else {n: getattr(out, n) for n in field_names(type(out))}
            self.writer.write_request(
                request_record(
                    {
                        **done,
                        **level,
                        "max_tokens": req.max_tokens,
                        "prefix_group": req.prefix_group,
                        "tenant": req.tenant,
                        "cache_salt": salt,
                        "request_class": req.request_class or "",
                        "session": req.session,
                        "turn": req.turn,
                        "tenant_name": req.admission_tenant,
                        "submit_time": submitted_at,
                    }
                )
            )
            self.advance(out, len(self.submitted))


def run_level(backend: Backend, level: Level, recorder: Recorder, seed: int) -> None:
    """Drive one level to the end: closed loop keeps ``level`` requests in flight; open loop
    submits at the arrival times of ``level.arrival`` (kvplan.workload.arrivals; Poisson when None:
    exponential gaps of mean 1/rate s), seeded per level, or at a trace's ``level.offsets``. A
    level with a plan sends its warm-up, measured and cool-down requests, or sends until its
    ``duration_s`` is up; then the requests in flight finish. A level of multi-turn sessions runs
    them as users would (kvplan.run.session_loop)."""
    key, requests = level.key, level.requests
    num = len(requests)
    plan = level.plan
    total = num if plan is None else plan.total_requests  # None: a timed level
    duration = None if plan is None else plan.duration_s
    if key.mode == "open":
        # min: a rate near float's top would make the seed word inf (rates are finite, > 0)
        rng = np.random.default_rng([seed, level.bucket_index, int(min(level.value * 1000, 2**63))])
        traced = level.offsets  # a trace's, else drawn
        arrivals = ArrivalOffsets(rng, level.value, total or num, level.arrival) if traced is None else traced
    if requests and requests[0].session is not None:  # multi-turn sessions (kvplan.run.session_loop)

        def send(index: int, arrival: float | None) -> str:
            req = requests[index]
            rid, salt = f"{key.id}/{index}", cache_salt(key, index, req)  # the level's salt for every turn
            recorder.submitted[rid] = (req, salt, backend.now())
            submission = Submission(rid, tuple(req.prompt_token_ids), req.max_tokens, seed + index, salt, arrival)
            backend.submit(replace(submission, output_token_ids=req.reply_token_ids, tenant=req.admission_tenant))
            return rid

        users, offsets = (int(level.value), None) if key.mode == "closed" else (None, lambda i: arrivals[i])
        return run_sessions(backend, requests, users, offsets, send, recorder.record)
    t0 = backend.now()
    end = t0 + duration if duration is not None else None
    sent = in_flight = 0
    unbuilt = getattr(backend, "takes_unbuilt_prompts", False)  # a simulated engine (kvplan.run.sim)

    def upcoming() -> float | None:
        """Closed loop: whether another request may go now (1.0) or not (None); open loop: the
        next request's scheduled arrival, None when the level sends no more."""
        if total is not None and sent >= total:
            return None
        if key.mode == "closed":
            return 1.0 if end is None or backend.now() < end else None
        at = t0 + arrivals[sent]
        return at if end is None or at < end else None

    # a benchmark client's warm-up (LevelSchedule.warmup_drained): all finished before the first
    # measured one is sent; copies of the first request (warmup_copies) or the list's first requests
    drained = 0 if plan is None or not plan.warmup_drained else plan.warmup_requests
    copies = drained if plan is not None and plan.warmup_copies else 0

    def submit(arrival: float | None) -> None:
        nonlocal sent, in_flight
        index = 0 if sent < copies else sent - copies  # the request list from its start after copies
        req = requests[index % num]
        rid, salt = f"{key.id}/{sent}", round_salt(cache_salt(key, index, req), index, num)
        recorder.submitted[rid] = (req, salt, backend.now())
        tenant = req.admission_tenant
        prompt = req.prompt_token_ids
        # a trace's prompt (kvplan.traffic.trace.TracePrompt) is built here; a simulated engine's
        # takes it unbuilt (TraceTokens: it never reads the ids) and its block hashes from its recipe
        lazy = getattr(prompt, "tokens", None) if unbuilt else None
        ids = cast(tuple, lazy()) if lazy is not None else tuple(prompt)  # a Sequence that acts as the tuple
        hashes = getattr(prompt, "block_hashes", None)
        backend.submit(
            Submission(rid, ids, req.max_tokens, seed + sent, salt, arrival, tenant=tenant, prompt_hashes=hashes)
        )
        sent += 1
        in_flight += 1

    while True:
        next_arrival = None
        if key.mode == "closed":
            while in_flight < level.value and upcoming() is not None and not (sent == drained and in_flight):
                submit(None)
        else:
            now = backend.now()
            while (at := upcoming()) is not None and at <= now:
                submit(at)
            next_arrival = upcoming()
            if not in_flight and next_arrival is not None:  # idle until the next scheduled arrival
                backend.wait_until(next_arrival)
                continue
        if not in_flight:
            return
        finished, steps = backend.advance(next_arrival)
        recorder.record(finished, steps)
        in_flight -= len(finished)
