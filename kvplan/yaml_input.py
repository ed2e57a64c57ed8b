"""YAML as kvplan reads it: one loader, and each failure as one line.

:class:`YamlLoader` is yaml.SafeLoader reading numbers with an exponent as YAML 1.2 does. PyYAML
resolves plain scalars by YAML 1.1, whose floats need a dot and a signed exponent (``1.0e+9``), so
``1e9``, ``1.0e9``, ``-2E-3`` or ``1e+3`` -- floats to YAML 1.2, JSON and most editors -- came
back as strings and were refused as "must be a number". Every YAML file kvplan reads goes through
it: the workload and the gate baseline with :func:`read_yaml` (:class:`UniqueKeyLoader`, which
also refuses a key given twice), a prices file (kvplan.sizing.gpus.prices) and the bundled data files
with :func:`load_data`. :func:`dump_yaml` writes with the same resolver, so a string that would
read back as a number (a bucket named ``1e3``) is quoted. Pydantic errors on what was read become
one line with :func:`kvplan.errors.validation_error`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from kvplan.errors import KvplanError

FLOAT_TAG = "tag:yaml.org,2002:float"
# YAML 1.2 core schema floats with an exponent (YAML 1.2.2 spec, 10.3.2 "Tag Resolution": a sign,
# digits with an optional fraction or a fraction alone, then [eE][-+]?digits), with YAML 1.1's
# underscores between digits kept. Those without an exponent YAML 1.1 already reads as floats.
FLOAT_WITH_EXPONENT = re.compile(r"^[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)[eE][-+]?[0-9]+$")
_FIRST = list("-+0123456789.")


class YamlLoader(yaml.SafeLoader):
    """yaml.SafeLoader that reads ``1e9``, ``1.0e9``, ``-2.5E-3`` and ``1e+3`` as floats (module
    docstring). Anything else resolves as before: ``1e9x`` and ``0.12.0`` stay strings, ``.inf``
    is a float and ``inf`` a string, ``1_000`` an int."""


class YamlDumper(yaml.SafeDumper):
    """yaml.SafeDumper that quotes a string :class:`YamlLoader` would read as a float."""


class _DataLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """:class:`YamlLoader`'s reading on libyaml's parser where PyYAML was built with it (the same
    resolver and constructors, so the same values; 5-10x faster on the GPU tables, which every
    GPU target reads), else the same class as :class:`YamlLoader`."""


for _cls in (YamlLoader, YamlDumper, _DataLoader):
    _cls.add_implicit_resolver(FLOAT_TAG, FLOAT_WITH_EXPONENT, _FIRST)


def load_data(text: str) -> Any:
    """One YAML document of kvplan's own (a bundled table) read as :class:`YamlLoader` reads it
    (on libyaml's parser where PyYAML has it); its errors are yaml.YAMLError, as yaml.safe_load's."""
    return yaml.load(text, Loader=_DataLoader)


def dump_yaml(data: Any, **options: Any) -> str:
    """``data`` as YAML (yaml.safe_dump's ``options``) that :class:`YamlLoader` reads back equal."""
    return yaml.dump(data, Dumper=YamlDumper, **options)


class DuplicateKeyError(yaml.YAMLError):
    """A mapping key given twice: ``key`` at 1-based ``line``, first given at ``first_line``."""

    def __init__(self, key: Any, line: int, first_line: int):
        super().__init__(f"duplicate key {key!r} at line {line} (first at line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


class UniqueKeyLoader(YamlLoader):
    """:class:`YamlLoader` that refuses a key given twice in one mapping (SafeLoader keeps the last
    one silently, so ``name:`` twice would run under the second name). Keys merged in with
    ``<<`` may still be overridden, as YAML's merge-key spec allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                if key in first:
                    raise DuplicateKeyError(key, line, first[key])
                first[key] = line
            except TypeError:  # an unhashable key: SafeLoader's own construct_mapping reports it
                continue
        return super().construct_mapping(node, deep)


def read_yaml(raw: bytes | str, source: str) -> Any:
    """Parse one YAML document.

    Raises:
        KvplanError: malformed YAML (with line and column), or a key given twice in a mapping
            (``<source>: line 25: duplicate key 'name' (first at line 4); keep one of them``).
    """
    try:
        return yaml.load(raw, Loader=UniqueKeyLoader)
    except DuplicateKeyError as err:
        raise KvplanError(
            f"line {err.line}",
            f"duplicate key {err.key!r} (first at line {err.first_line})",
            "keep one of them",
            source=source,
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise KvplanError("", f"malformed YAML: {at}{problem}", source=source) from None


# A workload YAML is kilobytes; one over this is a wrong path (a model's weights, a log) that was
# read whole only to fail: a 16 GB file, or /dev/zero, which never ends (the kvplan process grew
# to 21 GB before the kernel killed it, 2026-12-06).
MAX_INPUT_BYTES = 64 * 2**20


def read_input_file(path: str | Path, source: str, what: str) -> bytes:
    """The bytes of a small input file (``what``: "workload file", ...), reading at most one byte
    past :data:`MAX_INPUT_BYTES` (a pipe, such as ``<(envsubst < w.yaml)``, reads as a file does).

    Raises:
        KvplanError: on ``source``: cannot be read (missing, a folder, no permission), or longer
            than the limit.
    """
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_INPUT_BYTES + 1)
            size = os.fstat(file.fileno()).st_size  # 0 for a pipe or a device
    except OSError as err:
        raise KvplanError("", f"cannot read {what} ({err.strerror or err})", source=source) from None
    if len(raw) > MAX_INPUT_BYTES:
        known = f" ({size / 2**20:,.0f} MiB)" if size > MAX_INPUT_BYTES else ""
        problem = f"is larger than the {MAX_INPUT_BYTES // 2**20} MiB a {what} may be{known}"
        raise KvplanError("", problem, "check the path", source=source)
    return raw
