"""YAML input as kvplan reads it: one loader, and each failure as one line.

``read_yaml`` parses a file's bytes with :class:`UniqueKeyLoader` (yaml.SafeLoader that refuses a
key given twice). The workload YAML and the gate's baseline YAML both read through here; pydantic
errors on what was read become one line with :func:`kvplan.errors.validation_error`.
"""

from __future__ import annotations

from typing import Any

import yaml

from kvplan.errors import KvplanError


class DuplicateKeyError(yaml.YAMLError):
    """A mapping key given twice: ``key`` at 1-based ``line``, first given at ``first_line``."""

    def __init__(self, key: Any, line: int, first_line: int):
        super().__init__(f"duplicate key {key!r} at line {line} (first at line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (SafeLoader keeps the last
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
