"""Where a ModelSpec comes from: a bundled preset, a user's config.json (or a folder holding
one), Meta's params.json, or a GGUF file.

Presets are ``kvplan/data/models/*.json``: the published config.json of a real model with its
source, found by short name, Hugging Face id or alias, case-insensitively. A user's file goes
through the same reader as a preset (:meth:`ModelSpec.from_hf_config`); errors name the file.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from kvplan.errors import KvplanError
from kvplan.sizing.models.gguf_spec import is_gguf, read_gguf_config
from kvplan.sizing.models.kv_keys import READ_KEYS, check_kv_keys
from kvplan.sizing.models.meta_params import is_meta_params, meta_params_config
from kvplan.sizing.models.model_spec import ModelSpec

PRESETS_DIR = Path(__file__).parents[1] / "data" / "models"
# A Hugging Face model id: ``name`` or ``org/name`` of letters, digits, ``-``, ``_`` and ``.``.
_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# A Hugging Face config.json has one of these (transformers writes model_type and architectures;
# older GPT-2, Falcon and ChatGLM style configs name their layers so); else it is not one.
_HF_MARKS = ("num_hidden_layers", "model_type", "architectures", "text_config", "n_layer", "num_layers")


@lru_cache(maxsize=1)
def _catalog() -> dict[str, Path]:
    """Lower-cased short name, Hugging Face id and aliases -> preset file."""
    index: dict[str, Path] = {}
    for path in sorted(PRESETS_DIR.glob("*.json")):
        entry = json.loads(path.read_text())
        for key in (path.stem, entry["name"], entry["hf_id"], *entry.get("aliases", [])):
            index[key.lower()] = path
    return index


def preset_names() -> list[str]:
    """Short names of the bundled presets."""
    return sorted(path.stem for path in PRESETS_DIR.glob("*.json"))


def load_preset(name: str) -> tuple[ModelSpec, dict[str, Any]]:
    """A preset's spec and its catalog entry (name, hf_id, source, config).

    Raises:
        KvplanError: an unknown name, with the closest known names.
    """
    path = _catalog().get(name.lower())
    if path is None:
        close = difflib.get_close_matches(name.lower(), list(_catalog()), n=3, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(preset_names())}"
        raise KvplanError("model", f"unknown model {name!r}", f"{hint}; or give a config.json or .gguf path")
    entry = json.loads(path.read_text())
    return ModelSpec.from_hf_config(entry["config"], entry["name"]), entry


class ModelConfig(NamedTuple):
    """A model's Hugging Face style config dict as read, its name, the file it came from (None for
    a preset) and, for a GGUF or params.json file, which key of that file each config key came
    from (errors name the file's own keys)."""

    config: dict[str, Any]
    name: str
    path: Path | None = None
    key_names: dict[str, str] | None = None


def load_model_spec(model: str) -> ModelSpec:
    """A ModelSpec from a preset name or Hugging Face id (case-insensitive), a config.json or
    Meta params.json file, a folder holding config.json (or params.json, or one .gguf), or a .gguf
    file. A file is read as GGUF when its name ends in .gguf in any case or its first bytes are
    GGUF's magic, else as JSON (a params.json by its keys); the name a config file gets is
    :func:`_config_name`'s.

    Raises:
        KvplanError: an empty or unknown name, a missing or unreadable file, a JSON that is
            neither a Hugging Face config nor a params.json (naming the keys it lacks), a key that
            speaks of KV heads and that kvplan does not read (:mod:`kvplan.sizing.models.kv_keys`), or a
            config with a missing or bad field (named by the file's own key).
    """
    found = load_model_config(model)
    if found.path is None:
        return ModelSpec.from_hf_config(found.config, found.name)
    try:
        return ModelSpec.from_hf_config(found.config, found.name, found.key_names)
    except KvplanError as err:  # name the file the user gave, not the model
        raise err.within(source=str(found.path)) from None


def load_model_config(model: str) -> ModelConfig:
    """The config behind :func:`load_model_spec`'s spec of ``model`` (see ModelConfig). Raises as
    load_model_spec does for the name and the file."""
    if not model.strip():  # Path("") is the current folder
        raise KvplanError(
            "model",
            "the model name is empty",
            "give a preset name such as llama-3.1-8b, a config.json path or folder, or a .gguf file",
        )
    path = Path(model).expanduser()
    if path.is_dir():
        for name in ("config.json", "params.json"):
            if (path / name).is_file():
                return _read_json(path / name)
        ggufs = sorted(child for child in path.glob("*") if child.is_file() and is_gguf(child))
        if len(ggufs) == 1:
            path = ggufs[0]  # read below as a GGUF file
        else:
            raise KvplanError("", "holds no config.json or params.json (nor exactly one .gguf file)", source=str(path))
    if path.is_file():
        if is_gguf(path):
            config, name, key_names = read_gguf_config(path)
            return ModelConfig(config, name, path, key_names)
        return _read_json(path)
    if path.suffix.lower() in (".json", ".gguf"):
        raise KvplanError("", "no such file", source=str(path))
    entry = load_preset(model)[1]
    return ModelConfig(entry["config"], entry["name"])


def _config_name(path: Path, config: dict[str, Any]) -> str:
    """The model name shown for a config file, the first that applies: the config's
    ``_name_or_path`` if it is a Hugging Face id, not a local path (training leaves ``/fsx/ckpt/...``);
    a file not named config.json: its stem less a trailing ``.config``; a Hugging Face cache snapshot
    (``models--org--name/snapshots/<hash>/``): ``org/name``; else the folder's resolved name."""
    given = config.get("_name_or_path")
    if isinstance(given, str) and _HF_ID.fullmatch(given):
        return given
    if path.name.lower() not in ("config.json", "params.json"):
        return path.stem.removesuffix(".config") or path.stem
    folder = path.parent.resolve()  # not the file: a snapshot's config.json links into ../../blobs
    repo = folder.parent.parent.name
    if folder.parent.name == "snapshots" and repo.startswith("models--"):
        return "/".join(repo.split("--")[1:])  # the cache writes org/name as models--org--name
    return folder.name or str(folder)


def _read_json(path: Path) -> ModelConfig:
    """A config.json, or Meta's params.json mapped onto Hugging Face keys."""
    try:
        config = json.loads(path.read_text())
    except OSError as err:
        raise KvplanError("", f"cannot read: {err.strerror}", source=str(path)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise KvplanError("", f"not valid JSON ({err})", source=str(path)) from None
    if not isinstance(config, dict):
        raise KvplanError("", "not a config.json object", source=str(path))
    if is_meta_params(config):
        check_kv_keys(config, str(path), READ_KEYS | {"n_kv_heads"}, "n_kv_heads")  # read as Meta's keys
        hf_config, key_names = meta_params_config(config)
        return ModelConfig(hf_config, _config_name(path, {}), path, key_names)
    if not any(key in config for key in _HF_MARKS):
        meta_lacks = ", ".join(key for key in ("n_layers", "dim") if key not in config)
        raise KvplanError(
            "",
            f"a JSON in neither convention kvplan reads: it lacks {', '.join(_HF_MARKS[:3])} (a Hugging"
            f" Face config.json) and {meta_lacks} (Meta's params.json)",
            "give the model's config.json, its params.json or its .gguf file",
            source=str(path),
        )
    return ModelConfig(config, _config_name(path, config), path)
