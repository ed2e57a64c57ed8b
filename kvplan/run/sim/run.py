"""``kvplan simulate``: a workload through the engine's own scheduler on a cost-model clock.

::

    workload -> what to simulate (SimSetup: engine facts + a clock: calibrated | GPU | replay)
      -> the load test's sampled requests (same seed, same token ids; cached) -> every request fits?
      -> concurrency: auto resolved around the simulated knee -> estimate
      -> run folder with results.json (source simulated, status running)
      -> every level on a SimBackend through the load test's driver, records appended; beside
         them, on forked processes: knee and SLO capacity per bucket and target (search)
      -> the knees into the estimate -> summaries (steps.csv on a forked process) -> report

The run folder is the load test's (``start_run``, ``run_levels``, ``finish_run`` of
kvplan.run.loadtest), so ``kvplan report``, ``compare`` and ``gate`` read it unchanged. Nothing
here imports torch or transformers.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.results.run_result import EngineFacts, RunResult, WorkloadRef
from kvplan.results.simulated import DEFAULT_ATTAINMENT, TargetCapacity
from kvplan.results.store import KeptRecords, check_out
from kvplan.run.checks import check_requests_fit, check_shortest_fits, fit_check
from kvplan.run.driver import schedule_levels
from kvplan.run.estimate import compute_estimate
from kvplan.run.lifecycle import finish_run, now_iso, run_levels, start_run
from kvplan.run.sim.backend import SimBackend
from kvplan.run.sim.facts import simulated_facts, simulated_run_info
from kvplan.run.sim.search import resolve_auto, search_capacity, simulated_knees, with_knees
from kvplan.run.sim.setups import SimSetup
from kvplan.sizing.gpus.silicon_memo import keep_step_times
from kvplan.traffic.requests import SampledBuckets
from kvplan.traffic.samples import cached_sample
from kvplan.traffic.tokenizer import tokenize_function, tokenizer_identity
from kvplan.workload.schema import Workload
from kvplan.workload.trace import check_replay
from kvplan.workload.variants import all_variants, variant_workload


def variant_facts(workload: Workload, name: str, setup: SimSetup) -> EngineFacts:
    """The engine facts of ``setup`` on engine variant ``name`` (kvplan.workload.variants): for the
    workload's own engine, the facts a load test of the variant would read; for a GPU target, its
    facts with the variant's scheduler settings (block size, pool and dtypes stay the target's).

    Raises:
        KvplanError: a variant setting the engine would refuse (``engine.<field>``).
    """
    own = variant_workload(workload, name)
    if setup.gpu is None:
        return simulated_facts(own, setup.facts.device, setup.facts.attention_backend)
    knobs = ("max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching")
    return setup.facts.model_copy(update={k: getattr(own.engine, k) for k in knobs})


def sample(workload: Workload, facts: EngineFacts) -> SampledBuckets:
    """The requests a load test of ``workload`` sends (same seed, same token ids), every one
    checked to fit ``facts``' pool and max_model_len.

    Raises:
        KvplanError: what sampling and the fit checks raise (kvplan.traffic.prompts, kvplan.run.checks).
    """
    model = workload.engine.model
    check_replay(workload)  # a trace replayed whole: at most a level's 24 h
    check_shortest_fits(workload, facts)  # before drawing prompts no request of the bucket could use
    sampled = cached_sample(
        workload,
        lambda: tokenize_function(model),
        facts.vocab_size or 1,
        tokenizer_identity(model),
        fit_check(workload, facts),  # random lengths checked before their prompts are drawn
    )
    check_requests_fit(workload, facts, sampled.requests)
    return sampled


def simulate(
    workload: Workload,
    setup: SimSetup,
    run_dir: Path | None = None,
    *,
    console=None,
    plan: tuple[SimSetup, ...] = (),
    attainment: float = DEFAULT_ATTAINMENT,
    search: bool = True,
    charts: bool = False,
    note: Callable[[str], None] = lambda line: None,
    keep: list | None = None,
) -> Path:
    """Simulate ``workload`` on ``setup`` and write its run folder; returns the folder.

    plan: more targets (the workload's ``plan:`` entries) to answer the capacity questions for,
        without records. search: False skips the capacity search (knees stay in the estimate).
    charts: draw the report's PNGs too (seconds of matplotlib; ``kvplan report DIR`` draws them later).
    note: called with each line the user should read (a replay's levels left out).
    keep: where to put the run's records once the report is written, for the caller to free (the
        console script leaves them to the OS: kvplan.cli.app.script); None: freed on return.

    Raises:
        KvplanError: an ``out`` that cannot be a new run folder, prompts that cannot fill a bucket, a
            request that could never fit, a bad ``KVPLAN_SEARCH_JOBS``; all before the run folder exists.
    """
    started = now_iso()
    check_out(run_dir)
    search_jobs()  # a bad KVPLAN_SEARCH_JOBS before the run folder exists
    sampled = sample(workload, setup.facts)
    for target in plan:  # every request must fit every target before the run folder exists
        try:
            check_requests_fit(workload, target.facts, sampled.requests)
        except KvplanError as err:
            raise KvplanError(
                target.target,
                f"on {target.facts.model} / {target.facts.device}: {err.field}: {err.problem}",
                err.fix,
                source=workload.source,
            ) from None
    info = sampled.dataset_info
    lines, probed = info.get("num_lines"), info.get("probe_requests")
    if info.get("kind") == "trace" and isinstance(lines, int) and isinstance(probed, int) and probed < lines:
        note(
            f"trace: the knee and the SLO search run a sample of {probed:,} of its"
            f" {lines:,} requests, evenly spaced; the replay level runs every one"
        )
    workload = resolve_auto(workload, setup.facts, sampled.requests)
    searching = search and setup.timed
    # a disaggregated engine has no one pool to find a knee in; with a search, the knee is found
    # by the setup's search, beside the levels (None: not yet), and put in the estimate after them
    knees: dict | None = {} if setup.make_backend else None
    if knees is None and not searching:
        knees = simulated_knees(workload, setup.facts, sampled.requests)
    estimate, pricing = compute_estimate(setup.sized(workload), setup.facts, sampled.requests)
    estimate = with_knees(estimate, knees or {})
    result = RunResult(
        source="simulated",
        started_at=started,
        slo=workload.slo,
        level_plans=workload.level_plans,
        class_slos=workload.class_slos,
        engine=setup.facts,
        estimate=estimate,
        run=simulated_run_info(sampled.dataset_info),
        cost_model=setup.cost_model,
        workload=WorkloadRef(
            name=workload.name, source=workload.source, sha256=workload.sha256, config=workload.model_dump(mode="json")
        ),
    )
    variants = {name: variant_facts(workload, name, setup) for name in all_variants(workload)}
    for facts in variants.values():
        check_requests_fit(workload, facts, sampled.requests)
    result = result.model_copy(update={"variant_engines": variants})
    run_dir = start_run(workload, result, run_dir)

    backends: dict[str, tuple[SimBackend, Callable]] = {}

    def variant_backend(name: str) -> tuple[SimBackend, Callable]:
        """One backend per engine variant for the whole run, as the bundled engine keeps one engine."""
        if name not in backends:
            own = setup.sized(variant_workload(workload, name)).model_copy(update={"plan": []})
            pricing = compute_estimate(own, variants[name], sampled.requests)[1]
            admission = own.engine.admission.model_dump()  # the variant's admission, as the engine's
            backends[name] = (SimBackend(variants[name], setup.clock(), admission=admission), pricing.step_bytes)
        return backends[name]

    levels = schedule_levels(workload, sampled.requests, interference=True)
    own = setup.own_levels(levels)
    if len(own) < len(levels):
        kept = {lv.key.id for lv in own}
        left_out = ", ".join(lv.key.id for lv in levels if lv.key.id not in kept)
        note(f"--replay: not simulated, as the measured run did not run them: {left_out}")
    records = KeptRecords(finish_later=True)  # the records in memory too: the report reads no file back
    if keep is not None:
        keep.append(records)
    # the searches need none of the levels' records: on other cores while the levels run; one
    # target's search with two probes side by side where cores allow (kvplan.run.sim.ahead): on
    # two cores, once the levels are done (till then they hold one core, the search the other, and
    # the second probe's process waits for them: kvplan.run.sim.ahead)
    levels_done = multiprocessing.RawValue("b", 0)  # shared with the forked searches
    jobs = search_jobs()
    ahead: bool | Callable[[], bool] = (
        False if plan or jobs < 2 else True if jobs > 2 else lambda: bool(levels_done.value)
    )
    searches = (answers(workload, t, setup, knees, sampled, attainment, ahead) for t in (setup, *plan))
    collect = search_beside(list(searches)) if searching else None
    status = "interrupted"  # until run_levels says otherwise (an error in it stops the searches too)
    try:
        status = run_levels(
            setup.make_backend()
            if setup.make_backend
            else SimBackend(setup.facts, setup.clock(), admission=workload.engine.admission.model_dump()),
            own,
            run_dir,
            pricing.step_bytes,
            workload.seed,
            console,
            flush=False,
            variant_backend=variant_backend,
            kept=records,
        )
    finally:
        levels_done.value = 1
        if collect is not None and status == "complete":  # the report's modules (pandas: 0.4 s) while
            import kvplan.results.report.summary  # noqa: F401  # the searches finish, not after them
        found = collect(status == "complete") if collect is not None else None  # unfinished: none
    if knees is None:  # the setup's search found them (every bucket's answer holds its knee)
        knees = (
            {b.name: b.knee for b in found[0]}
            if found is not None
            else simulated_knees(workload, setup.facts, sampled.requests)  # a run that did not complete
        )
        result = result.model_copy(update={"estimate": with_knees(estimate, knees)})
    if found is not None:
        targets = [
            TargetCapacity(
                target=target.target,
                model=target.facts.model,
                gpu=target.gpu,
                tp=target.tp,
                kv_cache_dtype=target.facts.kv_cache_dtype,
                attainment_target=attainment,
                buckets=buckets,
                step_times=target.cost_model.step_times,
                weight_dtype=target.weight_dtype,
                ep=target.ep,
                dp=target.dp,
                backend=target.backend,
                disagg=target.disagg,
            )
            for target, buckets in zip((setup, *plan), found, strict=True)
        ]
        result = result.model_copy(update={"capacity": targets})
    return finish_run(run_dir, result, status, charts, records)


def answers(
    workload: Workload,
    target: SimSetup,
    setup: SimSetup,
    knees: dict | None,
    sampled: SampledBuckets,
    attainment: float,
    ahead: bool | Callable[[], bool] = False,
) -> Callable[[], list]:
    """The capacity search of ``target`` (``setup``'s own ``knees`` for ``setup``, found by the
    search where None, as for the other targets; a disaggregated target has no one pool to find a
    knee in), as a call; ``ahead``: with two probes side by side
    where it asks two in a row (kvplan.run.sim.ahead)."""

    def find() -> list:
        own = knees if target is setup and knees is not None else {} if target.make_backend else None
        if own is None:
            own = simulated_knees(workload, target.facts, sampled.requests)
        clock, make = target.clock, target.make_backend
        return search_capacity(
            workload, target.facts, sampled.requests, clock, attainment, own, make_backend=make, ahead=ahead
        )

    return find


_SEARCHES: list[Callable[[], list]] = []  # what a forked worker of search_all runs, by index


def _run_search(index: int) -> list:
    found = _SEARCHES[index]()
    keep_step_times()  # a forked worker's new step times (kvplan.sizing.gpus.silicon_memo): no atexit there
    return found


def search_jobs() -> int:
    """The processes the capacity searches may use: ``KVPLAN_SEARCH_JOBS`` where set (1: none
    forked), else one per core.

    Raises:
        KvplanError: ``KVPLAN_SEARCH_JOBS`` not a whole number >= 1 (once a ValueError traceback
            after the run folder was made).
    """
    value = os.environ.get("KVPLAN_SEARCH_JOBS")
    if not value:
        return os.cpu_count() or 1
    try:
        jobs = int(value)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise KvplanError(
            "KVPLAN_SEARCH_JOBS", f"must be a whole number >= 1 (got {value!r})", "unset it or give e.g. 1"
        )
    return jobs


def search_all(searches: list[Callable[[], list]]) -> list[list]:
    """Each of ``searches`` run, their answers in order: on a pool of processes forked from this
    one (so the searches, closures over the setups, need no pickling), one per core up to one per
    search, where there are two or more of each; else here, one after the other. Each search is
    deterministic (the same requests, seeds and clocks), so the answers are the same either way;
    only the wall time differs (``KVPLAN_SEARCH_JOBS=1``: here)."""
    workers = min(len(searches), search_jobs())
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [find() for find in searches]
    _SEARCHES[:] = searches
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_run_search, range(len(searches))))
    finally:
        _SEARCHES.clear()


def search_beside(searches: list[Callable[[], list]]) -> Callable[[bool], list[list] | None]:
    """``search_all(searches)`` started now, on forked processes (one per search, up to one per
    core), while this one goes on (the run's levels); returns what collects the answers:
    ``collect(True)`` waits for them (in order), ``collect(False)`` stops the searches and gives
    None (a run that did not complete answers nothing). Run here at ``collect(True)`` instead,
    as search_all does, where there is one core (or ``KVPLAN_SEARCH_JOBS=1``) or no fork (or this
    is a daemonic process, which may start none). Each
    search is deterministic, so the answers are the same either way; only the wall time differs."""
    jobs = search_jobs()
    if jobs < 2 or "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.current_process().daemon:
        return lambda complete: search_all(searches) if complete else None
    _SEARCHES[:] = searches
    try:  # the pool forks its workers here, each with the searches as they are now; Ctrl-C is this
        # process's to handle (it stops them), not theirs: a worker that took it would print a traceback
        pool = multiprocessing.get_context("fork").Pool(
            min(len(searches), jobs), initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)
        )
    finally:
        _SEARCHES.clear()
    pending = pool.map_async(_run_search, range(len(searches)), chunksize=1)
    pool.close()

    def collect(complete: bool) -> list[list] | None:
        try:
            return pending.get() if complete else None
        finally:
            pool.terminate()
            pool.join()

    return collect
