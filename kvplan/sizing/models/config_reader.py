"""Checked reads of a model config: whole numbers in range, mappings, per-layer lists.

Every config kvplan reads (a config.json, GGUF metadata mapped onto Hugging Face keys, Meta's
params.json mapped the same way) is read through one :class:`ConfigReader`, so every bad value
becomes one line naming the field. ``key_names`` spells a key the way the file being read spells
it: a GGUF file's errors name ``llama.attention.value_length``, not the Hugging Face key it was
mapped onto.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvplan.errors import KvplanError

# Upper bounds on config integers. No published model comes near them; they keep byte counts
# within float range and the per-layer tuples small (the deepest decoders have a few hundred layers).
MAX_SIZE = 2**31 - 1
MAX_LAYERS = 10_000


def _whole(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())


@dataclass(frozen=True)
class ConfigReader:
    """A config dict, the name errors give as their source, and how its keys are spelled."""

    cfg: dict[str, Any]
    name: str
    key_names: dict[str, str] = field(default_factory=dict)

    def key(self, key: str) -> str:
        """``key`` as the file spells it."""
        return self.key_names.get(key, key)

    def error(self, problem: str, fix: str | None = None) -> KvplanError:
        return KvplanError("", problem, fix, source=self.name)

    def present(self, *keys: str) -> str | None:
        """The first of ``keys`` that the config sets (not null)."""
        return next((key for key in keys if self.cfg.get(key) is not None), None)

    def missing(self, key: str, fix: str = "the config must set it") -> KvplanError:
        return self.error(f"missing field {self.key(key)}", fix)

    def count(
        self,
        *keys: str,
        default: Any = None,
        required: bool = False,
        minimum: int = 1,
        maximum: int = MAX_SIZE,
        fix: str = "the config must set it",
    ) -> Any:
        """The first of ``keys`` set, as a whole number in [minimum, maximum] (JSON may write 32
        as 32.0), else ``default``.

        Raises:
            KvplanError: ``missing field <key>`` (when ``required``), or ``field <key> must be ...``.
        """
        key = self.present(*keys)
        if key is None:
            if required:
                raise self.missing(keys[0], fix)
            return default
        return self._checked(key, self.cfg[key], minimum, maximum)

    def _checked(self, key: str, value: Any, minimum: int, maximum: int, where: str = "") -> int:
        if not _whole(value) or value < minimum:
            raise self.error(f"field {self.key(key)}{where} must be a whole number >= {minimum} (got {value!r})")
        if value > maximum:
            raise self.error(
                f"field {self.key(key)}{where} must be at most {maximum:,} (got {value!r})",
                "no published model comes near it",
            )
        return int(value)

    def per_layer(self, keys: tuple[str, ...], num_layers: int, default: Any = None, minimum: int = 1) -> list | None:
        """The first of ``keys`` set, as one whole number per layer: a number (the same for every
        layer, at least 1) or a list of ``num_layers`` numbers of at least ``minimum`` (GGUF's
        per-layer arrays, where 0 KV heads marks a layer without attention; OpenELM's head
        counts). None (or ``default`` for every layer) when no key is set.

        Raises:
            KvplanError: a list of another length, or an entry that is not a whole number in range.
        """
        key = self.present(*keys)
        if key is None:
            return None if default is None else [default] * num_layers
        value = self.cfg[key]
        if isinstance(value, (list, tuple)):
            if len(value) != num_layers:
                raise self.error(
                    f"field {self.key(key)} must list one number per layer, {num_layers} (got {len(value)})"
                )
            return [self._checked(key, v, minimum, MAX_SIZE, f"[{i}]") for i, v in enumerate(value)]
        return [self._checked(key, value, 1, MAX_SIZE)] * num_layers

    def mapping(self, key: str) -> dict[str, Any] | None:
        """``cfg[key]`` when it is a mapping (None when absent).

        Raises:
            KvplanError: a value that is not a mapping.
        """
        value = self.cfg.get(key)
        if value is not None and not isinstance(value, dict):
            raise self.error(f"field {self.key(key)} must be a mapping of keys to values (got {str(value)[:40]!r})")
        return value

    def within(self, cfg: dict[str, Any]) -> ConfigReader:
        """A reader of a nested mapping (``rope_scaling``) with the same name and spellings."""
        return ConfigReader(cfg, self.name, self.key_names)
