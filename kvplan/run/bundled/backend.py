"""The bundled engine in this process as a load-test backend.

``build_engine`` turns a workload's engine section into an ``LLMEngine`` (its settings errors
named by the YAML field); ``engine_facts`` reads what the rest of kvplan needs from it once, into
a frozen ``EngineFacts``; ``EngineBackend`` runs the driver's requests on it, one engine step per
``advance``, on ``time.perf_counter``. Only this module (and the fp8 check) touch the engine.

With ``engine.disagg`` the engine is engine.disagg.inproc.DisaggEngine (``build_disagg``):
``prefill.workers`` prefill and ``decode.workers`` decode engines, each with the engine section's
settings and its pool's over them (kvplan.workload.admission.EnginePool), driven by
``DisaggEngineBackend``, one ``DisaggEngine.step`` (a step of every worker with work) per
``advance``. A request's token 1 is the prefill worker's, timed when its step ended (the client's
TTFT), and its ``kv_transfer_s`` the measured copy of its KV (export + import, as the role servers
report it). Steps are not recorded: two pools have no one step index (as kvplan.run.sim.disagg's).
"""

from __future__ import annotations

import platform
import time
from typing import Any

from kvplan.errors import KvplanError
from kvplan.results.run_result import EngineFacts, RunInfo
from kvplan.run.driver import Finished, Submission
from kvplan.sizing import dtypes
from kvplan.workload.schema import Workload

# EngineConfig field -> the workload YAML's name for it, where they differ
_YAML_FIELDS = {"kv_cache_memory_bytes": "kv_cache_memory"} | {
    f"offload_{key}": f"offload.{key}" for key in ("host_gib", "disk_gib", "disk_path")
}


def build_engine(workload: Workload):
    """The ``LLMEngine`` the workload describes.

    Raises:
        KvplanError: a setting the engine refuses, named ``engine.<field>`` of the workload file
            (the engine's errors are ``engine.config.SettingError``s carrying their field), a
            model that cannot load (``engine.model``), or a base install without the engine
            extra (``engine``: torch, transformers or triton missing).
    """
    from engine.config import SettingError

    try:
        from engine.llm_engine import LLMEngine

        if workload.engine.disagg is not None:
            return build_disagg(workload)
    except ModuleNotFoundError as err:  # `pip install .` alone: the torch-free base
        raise KvplanError(
            "engine",
            f"the bundled engine needs {err.name}, which is not installed",
            "pip install 'kvplan[engine]' (torch==2.13.0 first), or load-test a running server with `target`",
            source=workload.source,
        ) from None

    try:
        return LLMEngine(workload.engine.to_engine_config(workload.seed))
    except SettingError as err:
        name = _YAML_FIELDS.get(err.field, err.field)  # the engine's text may name its field again
        raise KvplanError(f"engine.{name}", err.problem.replace(err.field, name), source=workload.source) from None


def is_disagg(engine) -> bool:
    """Whether ``engine`` is the disaggregated one (engine.disagg.inproc.DisaggEngine)."""
    return hasattr(engine, "decode")


def engine_facts(engine) -> EngineFacts:
    """The engine's KV pool, scheduler limits and model dims, read once after it was built (of a
    disaggregated engine: disagg_facts)."""
    from engine.models.llama import config_head_dim

    if is_disagg(engine):
        return disagg_facts(engine)

    cfg, config = engine.hf_config, engine.config
    return EngineFacts(
        model=engine.model_name,
        device=str(engine.device),
        dtype=str(engine.dtype).removeprefix("torch."),
        kv_cache_dtype=dtypes.canonical(str(engine.kv_cache_dtype)),
        attention_backend=engine.attention_backend,
        block_size=engine.block_size,
        num_blocks=engine.num_blocks,
        bytes_per_block=engine.bytes_per_block,
        max_model_len=engine.max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        enable_prefix_caching=config.enable_prefix_caching,
        seed=config.seed,
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=config_head_dim(cfg),
        vocab_size=cfg.vocab_size,
        hf_config=cfg.to_dict(),
        **_tier_blocks(engine.scheduler.block_manager.offload),
    )


def _tier_blocks(offload) -> dict[str, int]:
    """EngineFacts' offload capacities (blocks) of the engine's lower tiers (engine.offload.tiers)."""
    if offload is None:
        return {}
    return {f"offload_{t.name}_blocks": t.capacity for t in offload.tiers}


def run_info(dataset: dict[str, Any]) -> RunInfo:
    """Versions and machine of a run on the bundled engine; ``dataset``: what the prompts read."""
    import torch
    import transformers

    import kvplan

    return RunInfo(
        kvplan_version=kvplan.__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        dataset=dataset,
    )


def tokenizer_function(engine):
    """The engine's tokenizer as a batched ``texts -> token ids`` function (None without one)."""
    engine = engine.prefill[0].engine if is_disagg(engine) else engine
    if engine.tokenizer is None:
        return None
    return lambda texts: engine.tokenizer(texts)["input_ids"]


def warm_up(engine) -> None:
    """Run one 1-token prompt for 2 output tokens through ``engine`` before the first level,
    unrecorded. A fresh engine's first steps pay one-time costs (torch's lazy initialisation, first
    kernel launches, the allocator's growth) that would otherwise land on the first level's first
    requests: on the tiny model on a 2-core CPU, 17.8 ms for the first request against 0.7 ms for
    the next, which made a mixed level's P99 TTFT 18x that of the same class alone at one in
    flight. A prompt shorter than a block leaves the prefix cache as it was for every level (their
    cache salts differ from its none). A disaggregated engine warms every worker (warm_up_disagg)."""
    from engine.request import SamplingParams

    if is_disagg(engine):
        return warm_up_disagg(engine)
    engine.generate([[0]], SamplingParams(max_tokens=2, ignore_eos=True))


def backend_for(engine) -> EngineBackend:
    """The driver's backend over ``engine``: EngineBackend, or the disaggregated one's."""
    if is_disagg(engine):
        return DisaggEngineBackend(engine)
    return EngineBackend(engine)


class EngineBackend:
    """The driver's backend over one ``LLMEngine`` (kvplan.run.driver.Backend)."""

    def __init__(self, engine):
        self.engine = engine

    def now(self) -> float:
        return time.perf_counter()

    def submit(self, submission: Submission) -> None:
        self.engine.add_request(
            list(submission.prompt_token_ids),
            sampling_params(submission),
            request_id=submission.request_id,
            arrival_time=submission.arrival_time,
            cache_salt=submission.cache_salt,
            tenant=submission.tenant,
        )

    def advance(self, until: float | None) -> tuple[list[Finished], list[Any]]:
        """One engine step (short enough that ``until`` needs no honouring)."""
        outputs, stats = self.engine.step()
        return [finished_of(o) for o in outputs], [stats]

    def wait_until(self, when: float) -> None:
        time.sleep(max(0.0, when - time.perf_counter()))


def sampling_params(submission: Submission):
    """The engine's SamplingParams of a driver's request: its max_tokens and seed, EOS ignored, a
    replayed reply forced."""
    from engine.request import SamplingParams

    return SamplingParams(
        max_tokens=submission.max_tokens,
        ignore_eos=True,
        seed=submission.seed,
        forced_token_ids=submission.output_token_ids,
    )


def finished_of(o, kv_transfer_s: float | None = None) -> Finished:
    """The driver's Finished of an engine ``RequestOutput`` (``kv_transfer_s``: a disaggregated one's)."""
    return Finished(
        request_id=o.request_id,
        arrival_time=o.arrival_time,
        first_scheduled_time=o.first_scheduled_time,
        finish_time=o.finish_time,
        token_times=o.token_times,
        num_prompt_tokens=len(o.prompt_token_ids),
        num_output_tokens=len(o.output_token_ids),
        finish_reason=o.finish_reason,
        finish_detail=o.finish_detail,
        num_preemptions=o.num_preemptions,
        num_cached_tokens=o.num_cached_tokens,
        kv_transfer_s=kv_transfer_s,
    )


# ---- the bundled engine disaggregated (engine.disagg) ----------------------------------------------
def build_disagg(workload: Workload):
    """The ``DisaggEngine`` of ``workload.engine.disagg``.

    Raises:
        KvplanError: a setting a worker refuses, named ``engine.disagg.<pool>.<field>``.
    """
    from engine.config import SettingError
    from engine.disagg.inproc import DisaggEngine
    from engine.disagg.workers import worker_engine

    assert workload.engine.disagg is not None
    engines = {}
    for role in ("prefill", "decode"):
        config = workload.engine.pool(role).to_engine_config(workload.seed)
        try:
            engines[role] = [worker_engine(config, role) for _ in range(getattr(workload.engine.disagg, role).workers)]
        except SettingError as err:
            name = err.field.replace("kv_cache_memory_bytes", "kv_cache_memory")
            problem = err.problem.replace(err.field, name)
            raise KvplanError(f"engine.disagg.{role}.{name}", problem, source=workload.source) from None
    return DisaggEngine(engines["prefill"], engines["decode"])


def disagg_facts(engine) -> EngineFacts:
    """What the run checks requests against: a decode worker's facts with the smaller pool and
    max_model_len of the two pools and max_num_seqs x the decode workers (as
    kvplan.run.sim.gpu_target.disagg_setup's)."""
    pre, dec = engine_facts(engine.prefill[0].engine), engine_facts(engine.decode[0].engine)
    return dec.model_copy(
        update={
            "num_blocks": min(pre.num_blocks, dec.num_blocks),
            "max_model_len": min(pre.max_model_len, dec.max_model_len),
            "max_num_seqs": len(engine.decode) * dec.max_num_seqs,
        }
    )


def warm_up_disagg(engine) -> None:
    """``warm_up`` for every worker: x * y one-token prompts for 2 tokens each
    (request i reaches prefill worker i mod x and decode worker i mod y, so every worker runs, and the
    next request is routed as the first one would be), unrecorded."""
    from engine.request import SamplingParams

    count = len(engine.prefill) * len(engine.decode)
    for i in range(count):
        engine.add_request([0], SamplingParams(max_tokens=2, ignore_eos=True), request_id=f"warm-up {i}")
    while engine.has_unfinished():
        engine.step()
    engine.transfer_s.clear()


class DisaggEngineBackend(EngineBackend):
    """The driver's backend (kvplan.run.driver.Backend) over one in-process ``DisaggEngine``."""

    def submit(self, submission: Submission) -> None:
        self.engine.add_request(
            list(submission.prompt_token_ids),
            sampling_params(submission),
            request_id=submission.request_id,
            arrival_time=submission.arrival_time,
            cache_salt=submission.cache_salt,
        )

    def advance(self, until: float | None) -> tuple[list[Finished], list[Any]]:
        """One step of every worker (short enough that ``until`` needs no honouring)."""
        return [finished_of(o, self.engine.transfer_s.pop(o.request_id, None)) for o in self.engine.step()], []
