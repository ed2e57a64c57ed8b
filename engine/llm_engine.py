"""LLMEngine: the public API. One step reads on one screen::

    schedule(now) -> SchedulerOutput -> runner.execute -> logits [num_sampled, vocab]
        -> sampler -> token ids -> scheduler.update_from_output -> finished RequestOutputs + StepStats

The engine owns the clock (``time.perf_counter()`` seconds, passed to the scheduler) and the
glue; the scheduler owns queues and blocks, the runner owns tensors, the sampler owns generators.
A torch memory error inside a step finishes that step's requests with reason ``oom`` and the
engine goes on.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import torch

from engine.attention import get_attention_backend, resolve_backend_name
from engine.config import DEFAULT_KV_CACHE_MEMORY_BYTES, EngineConfig, SettingError
from engine.kv_cache import KVCache, is_oom_error
from engine.kv_scales import KVScales, measure_kv_scales
from engine.model_runner import ModelRunner, PromptLogits
from engine.models.llama import Transformer, config_head_dim
from engine.models.loader import load_model
from engine.offload.storage import build_offload
from engine.outputs import RequestOutput, StepStats
from engine.request import FinishReason, Request, SamplingParams
from engine.sampler import Sampler
from engine.scheduler import Scheduler

_TORCH_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "fp8": torch.float8_e4m3fn,
}


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when torch sees a GPU, else cpu; ``cpu`` and ``cuda`` as given.

    Raises:
        ValueError: ``cuda`` where torch sees no GPU (the check torch itself would only make later,
            as an AssertionError, when the first tensor moves there).
    """
    has_cuda = torch.cuda.is_available()
    if name == "auto":
        return torch.device("cuda" if has_cuda else "cpu")
    if name == "cuda" and not has_cuda:
        why = (
            f"torch {torch.__version__} is built without CUDA"
            if torch.version.cuda is None
            else "torch sees no CUDA GPU"
        )
        raise SettingError("device", f"cuda is not available here ({why}); use device auto or cpu")
    return torch.device(name)


class LLMEngine:
    """A paged-KV engine with continuous batching over one model.

    Raises (at construction), each an ``engine.config.SettingError`` (a ValueError) carrying the
    EngineConfig field, its message ``<field>: <problem>``:
        ModelLoadError: the model cannot be loaded (see ``engine.models.loader``).
        SettingError: ``device`` cuda where torch sees no GPU, ``max_model_len`` or ``block_size``
            above the model's max_position_embeddings, a KV budget below one block, or a KV pool
            the device cannot allocate (see ``KVCache``), an offload tier below one block, a host tier
            that cannot be allocated, a disk tier path that is not a writable directory or a disk
            without room for it (see ``engine.offload.storage.build_offload``).
        InterpreterRequired (also a RuntimeError): ``triton`` on CPU without TRITON_INTERPRET=1.
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        self._device = resolve_device(config.device)
        self._dtype = _TORCH_DTYPES["bfloat16" if config.dtype == "auto" else config.dtype]
        kv_dtype = config.kv_cache_dtype
        self._kv_cache_dtype = self._dtype if kv_dtype == "auto" else _TORCH_DTYPES[kv_dtype]
        self._attention_backend = resolve_backend_name(config.attention_backend, self._device)
        backend = get_attention_backend(self._attention_backend, self._device)

        loaded = load_model(config.model, self._dtype, config.seed)
        self._model_name = loaded.name
        self._tokenizer = loaded.tokenizer
        self.eos_token_ids = loaded.eos_token_ids
        self._hf_config = loaded.hf_model.config
        # ignore: transformers' PreTrainedModel.to is functools.wraps(torch.nn.Module.to), typed unbound (self first)
        self.model = Transformer.from_hf(loaded.hf_model.to(self._device), backend)  # type: ignore[arg-type]
        del loaded  # our modules hold the weights now; drop transformers' copies of q/k/v and gate/up

        cfg = self._hf_config
        max_pos = cfg.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > max_pos:
            raise SettingError(
                "max_model_len",
                f"must be <= the model's max_position_embeddings {max_pos} (got {config.max_model_len})",
            )
        if config.block_size > max_pos:  # no sequence could ever fill one block
            raise SettingError(
                "block_size", f"must be <= the model's max_position_embeddings {max_pos} (got {config.block_size})"
            )
        self.kv_cache = KVCache(
            cfg.num_hidden_layers,
            cfg.num_key_value_heads,
            config_head_dim(cfg),
            config.block_size,
            self._kv_cache_dtype,
            self._device,
            num_blocks=config.num_blocks,
            memory_bytes=None if config.num_blocks else config.kv_cache_memory_bytes or DEFAULT_KV_CACHE_MEMORY_BYTES,
        )
        self._max_model_len = config.max_model_len or min(max_pos, self.num_blocks * config.block_size)
        self.scheduler = Scheduler(config, self.num_blocks, self._max_model_len, self.eos_token_ids)
        self.scheduler.block_manager.offload = build_offload(config, self.kv_cache)  # None: no lower tier
        self.runner = ModelRunner(self.model, self.kv_cache, self._device)
        self.sampler = Sampler(config.seed)
        self._ids = itertools.count()
        self._step_index = 0
        self._prompt_logits: dict[str, torch.Tensor] = {}  # request id -> [num_prompt_logits, vocab]

    # ---- read-only views ---------------------------------------------------------------
    block_size = property(lambda self: self.kv_cache.block_size)
    num_blocks = property(lambda self: self.kv_cache.num_blocks)
    bytes_per_block = property(lambda self: self.kv_cache.bytes_per_block)  # all layers, K and V
    max_model_len = property(lambda self: self._max_model_len)
    hf_config = property(lambda self: self._hf_config)  # the transformers config of the model
    tokenizer = property(lambda self: self._tokenizer)  # None for tiny-random-llama
    device = property(lambda self: self._device)
    dtype = property(lambda self: self._dtype)
    kv_cache_dtype = property(lambda self: self._kv_cache_dtype)
    attention_backend = property(lambda self: self._attention_backend)  # "torch" | "triton"
    model_name = property(lambda self: self._model_name)

    # ---- fp8 KV calibration ------------------------------------------------------------
    def calibrate_kv_scales(self, prompts: list[list[int]]) -> KVScales:
        """Measure per-layer K/V amax over ``prompts`` (token ids) in the model dtype and install
        scale = amax / 448 on the KV cache (see ``engine.kv_scales``); returns the scales.

        Only an fp8 cache reads the scales; for other dtypes they are measured and kept unused.

        Raises:
            ValueError: no prompts, an empty prompt, a token id outside the vocabulary, or a
                prompt longer than the model's max_position_embeddings (the pass has its own cache,
                so the pool's size does not limit it).
            RuntimeError: called after the first step (the cache, and its prefix-cached blocks,
                already hold K/V quantised with the old scales).
        """
        if self._step_index:
            raise RuntimeError(
                "calibrate_kv_scales: call before the first step; the cache already "
                "holds K/V quantised with the old scales"
            )
        if not prompts or not all(prompts):
            raise ValueError("prompts: calibration needs at least one non-empty prompt")
        vocab, max_pos = self.hf_config.vocab_size, self.hf_config.max_position_embeddings
        for i, prompt in enumerate(prompts):
            if not all(0 <= t < vocab for t in prompt):
                raise ValueError(f"prompts[{i}]: every id must be in [0, {vocab}) for {self.model_name}")
            if len(prompt) > max_pos:
                raise ValueError(f"prompts[{i}]: {len(prompt)} tokens > max_position_embeddings {max_pos}")
        scales = measure_kv_scales(self.model, prompts, self.block_size, self._dtype, self._device)
        self.kv_cache.set_scales(list(scales.k_scales), list(scales.v_scales))
        return scales

    # ---- requests ----------------------------------------------------------------------
    def add_request(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
    ) -> str:
        """Queue a request; returns its id. ``arrival_time`` defaults to now (perf_counter s).
        ``tenant``: who sent it, for the config's per-tenant admission limits (engine.admission).

        A request that can never fit finishes at once with reason ``cannot_fit``, one admission
        refuses with reason ``rejected`` (both come out of the next ``step()``).

        Raises:
            ValueError: an empty prompt, a token id outside [0, vocab_size), a reused request_id,
                ``num_prompt_logits`` above the prompt's length.
        """
        vocab = self.hf_config.vocab_size
        if prompt_token_ids and not all(0 <= t < vocab for t in prompt_token_ids):
            raise ValueError(f"prompt_token_ids: every id must be in [0, {vocab}) for {self.model_name}")
        if request_id is None:  # the next counter value that no caller has taken
            request_id = str(next(self._ids))
            while self.scheduler.knows(request_id):
                request_id = str(next(self._ids))
        now = time.perf_counter()
        request = Request(
            request_id,
            tuple(prompt_token_ids),
            sampling_params,
            now if arrival_time is None else arrival_time,
            cache_salt,
            tenant,
        )
        self.scheduler.add_request(request, now)
        self.sampler.add(request_id, sampling_params)
        return request_id

    def abort(self, request_id: str) -> None:
        """Finish a request now and free its blocks; it comes out of the next ``step()``.
        Unknown or finished ids are ignored."""
        self.scheduler.finish_requests([request_id], FinishReason.ABORT, time.perf_counter())

    def has_unfinished(self) -> bool:
        """True while a request waits or runs, or has finished (aborted, cannot_fit) with its
        output not yet returned by ``step()``: ``while engine.has_unfinished(): engine.step()``
        collects every output."""
        return self.scheduler.has_unfinished() or self.scheduler.has_untaken_finished()

    # ---- one step ----------------------------------------------------------------------
    def step(self) -> tuple[list[RequestOutput], StepStats]:
        """Schedule, run, sample, update. Returns the requests finished during this step (and any
        aborted or rejected since the last one) and this step's stats."""
        start = time.perf_counter()
        sched = self.scheduler.schedule(start)
        num_oom = 0
        if not sched.is_empty:
            try:
                out = self.runner.execute(sched)
                params = [self.scheduler.get_request(r).sampling_params for r in out.request_ids]
                token_ids = self.sampler.sample(out.logits, out.request_ids, params)
                for part in out.prompt_logits:
                    self._keep_prompt_logits(part)
            except (torch.OutOfMemoryError, RuntimeError) as e:
                if not is_oom_error(e):
                    raise
                ids = [s.request_id for s in sched.scheduled]
                num_oom = len(ids)
                detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                self.scheduler.finish_requests(ids, FinishReason.OOM, time.perf_counter(), detail)
            else:
                self.scheduler.update_from_output(sched, dict(zip(out.request_ids, token_ids)), time.perf_counter())
        outputs = [self._output(r) for r in self.scheduler.take_finished()]
        stats = self.scheduler.step_stats(self._step_index, start, time.perf_counter(), sched, len(outputs), num_oom)
        self._step_index += 1
        return outputs, stats

    def _keep_prompt_logits(self, part: PromptLogits) -> None:
        """Copy one step's requested prompt-logit rows into the request's buffer, by position
        (a recompute after preemption overwrites the same rows)."""
        request = self.scheduler.get_request(part.request_id)
        n = request.sampling_params.num_prompt_logits
        buffer = self._prompt_logits.get(part.request_id)
        if buffer is None:
            buffer = torch.empty(n, part.logits.shape[1], dtype=part.logits.dtype, device=part.logits.device)
            self._prompt_logits[part.request_id] = buffer
        row = part.first_position - (request.num_prompt_tokens - n)
        buffer[row : row + part.logits.shape[0]] = part.logits

    def _output(self, request: Request) -> RequestOutput:
        self.sampler.free(request.request_id)
        text = None
        if self.tokenizer is not None:
            text = self.tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
        prompt_logits = self._prompt_logits.pop(request.request_id, None)
        if request.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
            prompt_logits = None  # aborted or failed before every row was computed
        return RequestOutput.from_request(request, text, prompt_logits)

    # ---- offline batch -----------------------------------------------------------------
    def generate(
        self, prompts: Sequence[list[int] | str], sampling_params: SamplingParams | list[SamplingParams]
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion; outputs in input order. Strings are tokenised as plain
        text (no chat template). Other requests already queued run too; their outputs are dropped.

        Raises:
            ValueError: string prompts on a model without a tokenizer, or a params list whose
                length differs from the prompts'.
        """
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"sampling_params: need one per prompt ({len(prompts)}), got {len(sampling_params)}")
        ids = []
        for prompt, params in zip(prompts, sampling_params):
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ValueError(f"prompts: {self.model_name} has no tokenizer; pass token ids")
                prompt = self.tokenizer(prompt)["input_ids"]
            ids.append(self.add_request(prompt, params))
        done: dict[str, RequestOutput] = {}
        pending = set(ids)
        while pending:
            outputs, stats = self.step()
            for o in outputs:
                if o.request_id in pending:
                    done[o.request_id] = o
                    pending.discard(o.request_id)
            if pending and not outputs and stats.num_prefill_tokens + stats.num_decode_tokens == 0:
                raise RuntimeError("engine: a step scheduled nothing while requests wait (scheduler stuck)")
        return [done[i] for i in ids]
