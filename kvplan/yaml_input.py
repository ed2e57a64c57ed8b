"""YAML input as kvplan reads it: one loader, and each failure as one line.

``read_yaml`` parses a file's bytes with :class:`UniqueKeyLoader` (yaml.SafeLoader that refuses a
key given twice); ``describe_error`` turns the first pydantic error into (YAML path, problem),
e.g. ``("buckets[1].concurrency[0]", "must be >= 1 (got 0)")``. The workload YAML and the gate's
baseline YAML both read through here.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from kvplan.errors import KvplanError

_MESSAGES = {
    "missing": "required field missing",
    "extra_forbidden": "unknown field; check the spelling or remove it",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "too_short": "must not be empty",
    "string_pattern_mismatch": "may hold only letters, digits, '_', '-' and '.'",
    "finite_number": "must be a finite number",
    "byte_size": "must be a size such as 48MiB, 1.5GiB or 512MB",
    "byte_size_unit": "unknown unit; use B, KB, MB, GB, KiB, MiB or GiB (e.g. 48MiB)",
}


def _yaml_path(loc: tuple[str | int, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def describe_error(err: ValidationError) -> tuple[str, str]:
    """The first pydantic error as (YAML path, problem), e.g. ("buckets[1].concurrency[0]",
    "must be >= 1 (got 0)"). Further errors are counted, not listed: one line per failure."""
    first = err.errors()[0]
    kind, ctx, value = first["type"], first.get("ctx") or {}, first.get("input")
    if kind == "greater_than_equal":
        problem = f"must be >= {ctx['ge']}"
    elif kind == "greater_than":
        problem = f"must be > {ctx['gt']}"
    elif kind == "less_than_equal":
        problem = f"must be <= {ctx['le']:g}" if isinstance(ctx["le"], float) else f"must be <= {ctx['le']}"
    elif kind == "string_too_long":
        problem = f"must be at most {ctx['max_length']} characters (names become file names)"
    elif kind == "literal_error":
        problem = f"must be one of {ctx['expected'].replace(' or ', ', ')}"
    elif kind == "value_error":
        problem = str(ctx.get("error", first["msg"]))
    else:
        problem = _MESSAGES.get(kind, first["msg"][:1].lower() + first["msg"][1:])
    if kind == "string_too_long":
        problem += f" (got {len(value)} characters)"
    elif kind not in ("missing", "value_error") and not isinstance(value, (dict, list)):
        problem += f" (got {value!r})"
    if err.error_count() > 1:
        problem += f" [+{err.error_count() - 1} more]"
    return _yaml_path(first["loc"]), problem


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
        raise KvplanError(f"{source}: line {err.line}", f"duplicate key {err.key!r} (first at line {err.first_line})",
                          "keep one of them") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise KvplanError(source, f"malformed YAML: {at}{problem}") from None
