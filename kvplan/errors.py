"""KvplanError: bad input becomes one line naming the input, the problem, and the fix.

An error names its input by *field*, never by how the user typed it: an option's name
(``kv_cache_dtype``), a YAML path (``buckets[1].concurrency[2]``), a record (``line 3``). Only the
CLI turns a field into a flag (``--kv-cache-dtype``); a workload reader prefixes its YAML path
(``plan[0].kv_cache_dtype``) with :meth:`KvplanError.within`. Problem and fix texts name other
inputs in backticks (```weights_gib```), rendered the same way::

    estimate_capacity(tp=3)           KvplanError("tp", "3 does not divide the 32 attention heads")
    kvplan estimate --tp 3            error: --tp: 3 does not divide the 32 attention heads
    plan: [{..., tp: 3}] in chat.yaml error: chat.yaml: plan[0].tp: 3 does not divide the 32 attention heads
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic is imported by what validates, not by every error
    from pydantic import ValidationError

_REF = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")
Flag = Callable[[str], "str | None"]  # field name -> how the user spells it (None: as is)


class KvplanError(Exception):
    """A user-facing error: the CLI prints it as one red line and exits with ``exit_code``.

    field: the input at fault (see the module docstring); "" when the source itself is.
    problem: what is wrong with the value seen. fix: what to do (optional).
    source: the file the field belongs to (a workload YAML, a config.json), None for an option.
    """

    exit_code = 2

    def __init__(self, field: str, problem: str, fix: str | None = None, *, source: str | None = None):
        self.field, self.problem, self.fix, self.source = field, problem, fix, source
        super().__init__(self.render())

    @property
    def where(self) -> str:
        """``source: field``, either part left out when empty."""
        return ": ".join(part for part in (self.source, self.field) if part)

    def render(self, flag: Flag | None = None) -> str:
        """The one line. ``flag`` spells a field name the way the user typed it (the CLI passes
        name -> ``--name``, None for a name it has no option for). The field is respelled only
        when it belongs to no file (a YAML path stays a path); backticked names in the texts
        always are."""

        def spell(name: str) -> str:
            return (flag(name) if flag is not None else None) or name

        field = self.field
        if field and self.source is None:
            field = ", ".join(spell(part) for part in field.split(", "))
        refs = lambda text: _REF.sub(lambda m: spell(m[1]), text)  # noqa: E731
        where = ": ".join(part for part in (self.source, field) if part)
        message = f"{where}: {refs(self.problem)}" if where else refs(self.problem)
        return f"{message}; {refs(self.fix)}" if self.fix else message

    def within(self, source: str | None = None, prefix: str = "", fix: str | None = None) -> KvplanError:
        """The same error as part of a file: ``prefix`` (a YAML path such as ``plan[0]``) goes in
        front of the field, ``source`` names the file, ``fix`` replaces a fix that only made sense
        for an option. Keeps the class (and so the exit code)."""
        field = (
            f"{prefix}.{self.field}"
            if prefix and self.field and not self.field.startswith("[")
            else prefix + self.field
        )
        err = type(self).__new__(type(self))
        KvplanError.__init__(
            err,
            field,
            self.problem,
            fix if fix is not None else self.fix,
            source=source if source is not None else self.source,
        )
        return err


# ---- pydantic errors as (YAML path, problem) -------------------------------------------------
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


def yaml_path(loc: tuple[str | int, ...]) -> str:
    """pydantic's error location as a YAML path: ``("buckets", 1, "concurrency", 0)`` ->
    ``buckets[1].concurrency[0]``."""
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
    return yaml_path(first["loc"]), problem


def validation_error(err: ValidationError, source: str | None, prefix: str = "") -> KvplanError:
    """A pydantic ValidationError as a KvplanError on ``source`` (the first error's path, under
    ``prefix`` when the model validated was part of a larger document)."""
    where, problem = describe_error(err)
    return KvplanError(where, problem, source=source).within(prefix=prefix)
