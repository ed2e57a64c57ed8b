"""The bundled engine in this process as a load-test backend.

``build_engine`` turns a workload's engine section into an ``LLMEngine`` (its settings errors
named by the YAML field); ``engine_facts`` reads what the rest of kvplan needs from it once, into
a frozen ``EngineFacts``; ``EngineBackend`` runs the driver's requests on it, one engine step per
``advance``, on ``time.perf_counter``. Only this module (and the fp8 check) touch the engine.
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


def engine_facts(engine) -> EngineFacts:
    """The engine's KV pool, scheduler limits and model dims, read once after it was built."""
    from engine.models.llama import config_head_dim

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
    cache salts differ from its none)."""
    from engine.request import SamplingParams

    engine.generate([[0]], SamplingParams(max_tokens=2, ignore_eos=True))


class EngineBackend:
    """The driver's backend over one ``LLMEngine`` (kvplan.run.driver.Backend)."""

    def __init__(self, engine):
        self.engine = engine

    def now(self) -> float:
        return time.perf_counter()

    def submit(self, submission: Submission) -> None:
        from engine.request import SamplingParams

        params = SamplingParams(
            max_tokens=submission.max_tokens,
            ignore_eos=True,
            seed=submission.seed,
            forced_token_ids=submission.output_token_ids,
        )
        self.engine.add_request(
            list(submission.prompt_token_ids),
            params,
            request_id=submission.request_id,
            arrival_time=submission.arrival_time,
            cache_salt=submission.cache_salt,
            tenant=submission.tenant,
        )

    def advance(self, until: float | None) -> tuple[list[Finished], list[Any]]:
        """One engine step (short enough that ``until`` needs no honouring)."""
        outputs, stats = self.engine.step()
        finished = [
            Finished(
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
            )
            for o in outputs
        ]
        return finished, [stats]

    def wait_until(self, when: float) -> None:
        time.sleep(max(0.0, when - time.perf_counter()))
