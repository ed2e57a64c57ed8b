"""MkDocs hook: the workload YAML reference, generated from its JSON Schema at build time.

docs/workloads.md holds the marker below; ``on_page_markdown`` replaces it with one Markdown
table per object of ``kvplan.schemas.json_schema("workload")`` (the top level, then each
``$defs`` entry in the order the YAML reaches it), so the reference cannot drift from the
pydantic models that validate a workload. Columns: field, type, default, description.

Read by MkDocs through ``hooks:`` in mkdocs.yml; it needs kvplan importable (the project's
.venv). A schema that cannot be read fails the build rather than leaving the marker in place.
"""

from __future__ import annotations

import json
import re
from typing import Any

MARKER = "<!-- workload-reference -->"
PAGE = "workloads.md"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE or MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference(_workload_schema()))


def _workload_schema() -> dict[str, Any]:
    try:
        from kvplan.schemas import json_schema

        return json_schema("workload")
    except (ImportError, TypeError):  # json_schema moved or changed: the model itself
        from kvplan.workload.schema import Workload

        return Workload.model_json_schema(mode="validation")


def reference(schema: dict[str, Any]) -> str:
    """The whole reference: a section per object, top level first."""
    defs = schema.get("$defs", {})
    sections = [_section("Top level", "", schema, defs)]
    for name, path in _reached(schema, defs).items():
        sections.append(_section(name, path, defs[name], defs))
    return "\n\n".join(sections) + "\n"


def _reached(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, str]:
    """``$defs`` name -> the first YAML path that reaches it (breadth first from the top)."""
    found: dict[str, str] = {}
    queue = [("", schema)]
    while queue:
        path, node = queue.pop(0)
        for field, sub in (_object_of(node) or {}).get("properties", {}).items():
            where = f"{path}.{field}" if path else field
            for ref, suffix in _refs(sub):
                if ref in defs and ref not in found:
                    found[ref] = where + suffix
                    queue.append((where + suffix, defs[ref]))
    return found


def _refs(node: dict[str, Any], suffix: str = "") -> list[tuple[str, str]]:
    """The ``$defs`` names a field's schema points at, with ``[]`` / ``.*`` for list items and
    map values."""
    out = []
    if "$ref" in node:
        out.append((node["$ref"].rsplit("/", 1)[-1], suffix))
    for option in node.get("anyOf", []) + node.get("oneOf", []) + node.get("allOf", []):
        out += _refs(option, suffix)
    if isinstance(node.get("items"), dict):
        out += _refs(node["items"], suffix + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += _refs(node["additionalProperties"], suffix + ".*")
    return out


def _object_of(node: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema of a definition: itself, or the model variant of a shorthand union
    (``Lengths``: an integer, a ``[min, max]`` pair, or the ``{min, max, dist, ...}`` object)."""
    if "properties" in node:
        return node
    objects = [o for o in node.get("anyOf", []) if "properties" in o]
    objects.sort(key=lambda o: ("title" not in o, -len(o["properties"])))
    return objects[0] if objects else None


def _section(name: str, path: str, node: dict[str, Any], defs: dict[str, Any]) -> str:
    obj = _object_of(node) or {}
    title = f"### {name}" + (f" (`{path}`)" if path else "") + " {#" + _anchor(name) + "}"
    lines = [title, ""]
    if name != "Top level" and obj.get("description"):
        lines += [_prose(obj["description"]), ""]
    shorthands = [o for o in node.get("anyOf", []) if o is not obj]
    if shorthands:
        lines += ["Also written as: " + "; ".join(_type(o, defs) for o in shorthands) + ".", ""]
    required = set(obj.get("required", []))
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for field, sub in obj.get("properties", {}).items():
        default = "required" if field in required else _default(sub)
        text = _prose(sub.get("description", "")).replace("\n\n", " ")
        if sub.get("deprecated") and "deprecated" not in text.lower():
            text = ("Deprecated. " + text).strip()
        lines.append(f"| `{field}` | {_cell(_type(sub, defs))} | {_cell(default)} | {_cell(text)} |")
    return "\n".join(lines)


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """A field's type in words: ``integer ≥ 1``, ``list of Bucket``, ``one of a, b``."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    if len(node.get("allOf", [])) == 1:  # how some pydantic versions wrap a described $ref
        return _type(node["allOf"][0], defs)
    if "const" in node:
        return _value(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(_value(v) for v in node["enum"])
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        return " or ".join(_type(o, defs) for o in options)
    kind = node.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    elif kind == "array":
        items = _type(node.get("items", {}), defs)
        items = f"({items})" if " " in items and not items.startswith("[") else items
        if node.get("minItems") is not None and node.get("minItems") == node.get("maxItems"):
            return f"list of {node['minItems']} ({items})"
        kind = f"list of {items}"
    elif kind == "object" and isinstance(node.get("additionalProperties"), dict):
        kind = f"map of name to {_type(node['additionalProperties'], defs)}"
    elif kind == "object" and node.get("properties"):  # a shorthand such as {jsonl: PATH}
        kind = "`{" + ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in node["properties"].items()) + "}`"
    bounds = _bounds(node)
    if not bounds:
        return kind
    return f"{kind} {bounds}" if kind in ("integer", "number", "string") else f"{kind}, {bounds}"


def _bounds(node: dict[str, Any]) -> str:
    """JSON Schema's bounds in words: ``≥ 1, ≤ 4294967295``. Regular expressions (``pattern``)
    are left out: they read badly in a table, and the descriptions state the rule in words."""
    parts = [
        f"{sign}\u00a0{node[key]}"
        for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))
        if key in node
    ]  # a no-break space keeps "≥ 1" together in a narrow column
    if "minItems" in node:
        parts.append(f"at least {node['minItems']} item" + ("s" if node["minItems"] != 1 else ""))
    if "maxItems" in node:
        parts.append(f"at most {node['maxItems']} items")
    if "maxLength" in node:
        parts.append(f"at most {node['maxLength']} characters")
    return ", ".join(parts)


def _value(value: Any) -> str:
    """A YAML value as written: `auto`, `16`, `null`, `[]`."""
    return f"`{value}`" if isinstance(value, str) and value else f"`{json.dumps(value)}`"


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return ""
    value = node["default"]
    return "its fields' defaults" if isinstance(value, dict) and value else _value(value)


def _prose(text: str) -> str:
    """A docstring as Markdown: reStructuredText ``code`` to `code`, lines of a paragraph joined."""
    text = re.sub(r"``(.+?)``", r"`\1`", text.strip())
    return "\n\n".join(" ".join(p.split()) for p in re.split(r"\n\s*\n", text))


def _cell(text: str) -> str:
    """Table-cell safe: no newlines, pipes escaped."""
    return text.replace("\n", " ").replace("|", "\\|")


def _anchor(name: str) -> str:
    return "workload-" + name.lower().replace(" ", "-")
