"""GPU prices: USD per GPU-hour for each GPU of the GPU table, with where each figure was read.

``data/gpu_prices.yaml`` holds public on-demand list prices (see its header for the sources and how a per-GPU figure
is derived from an instance price); a user's ``--prices FILE`` replaces it, in the same YAML form::

    prices:
      H100-SXM: {usd_per_gpu_hour: 6.88, source: "AWS p5.48xlarge ... https://...", date: "2026-11-09"}

or as a CSV with the header ``gpu,usd_per_gpu_hour,source,date``. GPU names are resolved by
:func:`kvplan.sizing.gpus.gpus.canonical_gpu` (canonical names and aliases, never a prefix), so the result is keyed by
canonical names.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.sizing.gpus.gpus import canonical_gpu, gpu_hint
from kvplan.yaml_input import read_input_file

PRICES_FILE = Path(__file__).parents[1] / "data" / "gpu_prices.yaml"
COLUMNS = ("gpu", "usd_per_gpu_hour", "source", "date")
_FIELDS = COLUMNS[1:]
_FIX = "give prices: with one GPU: {usd_per_gpu_hour, source, date} entry per GPU"


@dataclass(frozen=True)
class GpuPrice:
    """What one GPU costs on demand.

    gpu: the canonical name (data/gpus.yaml). usd_per_gpu_hour: USD per GPU per hour (> 0).
    source: the provider, offering and address the price was read at. date: when it was published or read,
    ``YYYY-MM-DD``.
    """

    gpu: str
    usd_per_gpu_hour: float
    source: str
    date: str


def load_prices(path: Path | None = None) -> dict[str, GpuPrice]:
    """Canonical GPU name -> its price, from ``path`` (a YAML or, by its ``.csv`` suffix, a CSV file) or, with
    None, the shipped ``data/gpu_prices.yaml``. Order is the file's.

    Raises:
        KvplanError: one line naming the file, the entry (a GPU key, or ``line N`` of a CSV) and the field: a
        missing file or column, a price that is not a number > 0, an empty source, a date not ``YYYY-MM-DD``, an
        unknown GPU name (with the closest known names), or a GPU given twice.
    """
    path = PRICES_FILE if path is None else Path(path)
    try:  # at most 64 MiB: a wrong path (/dev/zero, a model's weights) is not read whole
        raw = read_input_file(path, str(path), "prices file")
    except KvplanError as err:
        fix = "give an existing file" if err.problem.startswith("cannot read") else err.fix
        problem = err.problem.replace("cannot read prices file", f"cannot read {path}", 1)
        raise KvplanError("prices", problem if problem.startswith("cannot") else f"{path} {problem}", fix) from None
    try:
        text = raw.decode("utf-8-sig")  # a spreadsheet's CSV may start with a byte-order mark
    except UnicodeDecodeError as err:
        raise KvplanError("prices", f"{path} is not UTF-8 text (byte {err.start})", "save it as UTF-8") from None
    name = path.name
    rows = _csv_rows(text, name) if path.suffix.lower() == ".csv" else _yaml_rows(text, name)
    prices: dict[str, GpuPrice] = {}
    for where, gpu_name, fields in rows:
        price = _price(where, gpu_name, fields, name)
        if price.gpu in prices:
            raise KvplanError(where, f"{price.gpu} is priced twice", "keep one entry per GPU", source=name)
        prices[price.gpu] = price
    return prices


_Row = tuple[str, str, dict[str, object]]  # (where: a GPU key or "line N", the GPU name, field -> raw value)


def _key(key: object) -> str:
    """A YAML key as an error names it: as written, or quoted when it holds a line break or another
    unprintable character (the error stays one line)."""
    text = str(key)
    return text if text.isprintable() else repr(text)


def _yaml_rows(text: str, name: str) -> list[_Row]:
    import yaml

    from kvplan.yaml_input import YamlLoader

    class _Strict(YamlLoader):
        """PyYAML keeps the last of two equal keys silently; a GPU priced twice must say so."""

    def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
        keys = [loader.construct_object(k) for k, _ in node.value]
        twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        if twice is not None:
            raise KvplanError(_key(twice), f"{_key(twice)} is given twice", "keep one entry per GPU", source=name)
        return loader.construct_mapping(node)

    _Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
    try:
        data = yaml.load(text, Loader=_Strict)  # noqa: S506 - a SafeLoader
    except ValueError as err:  # a scalar YAML reads as a date but is none, e.g. date: 2026-13-01
        raise KvplanError("date", f"not a date ({err})", "write dates as 'YYYY-MM-DD' in quotes", source=name) from None
    except yaml.YAMLError as err:
        problem = str(getattr(err, "problem", None) or err).splitlines()[0]
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise KvplanError("", f"not valid YAML ({problem}{at})", source=name) from None
    table = data.get("prices") if isinstance(data, dict) else None
    if not isinstance(table, dict) or not table:
        raise KvplanError("prices", "must be a mapping of GPU name -> entry", _FIX, source=name)
    rows: list[_Row] = []
    for key, entry in table.items():
        where = _key(key)
        if not isinstance(entry, dict):
            raise KvplanError(where, "must be a mapping", _FIX, source=name)
        unknown = sorted(_key(k) for k in entry if k not in _FIELDS)
        if unknown:
            raise KvplanError(f"{where}: {unknown[0]}", "unknown field", f"give {', '.join(_FIELDS)}", source=name)
        rows.append((where, str(key), {f: entry[f] for f in _FIELDS if f in entry}))
    return rows


def _csv_rows(text: str, name: str) -> list[_Row]:
    reader = csv.DictReader(text.splitlines())
    header = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise KvplanError("", f"missing column {missing[0]}", f"give {','.join(COLUMNS)}", source=name)
    reader.fieldnames = header
    rows: list[_Row] = []
    for record in reader:
        where = f"line {reader.line_num}"
        if None in record:
            raise KvplanError(where, f"more than {len(header)} values", "quote values that hold commas", source=name)
        values = {k: (v.strip() if isinstance(v, str) else v) for k, v in record.items()}
        fields = {f: values[f] for f in _FIELDS if values.get(f) not in (None, "")}
        rows.append((where, str(values.get("gpu") or ""), fields))
    if not rows:
        raise KvplanError("", "no prices", f"give one row per GPU under {','.join(COLUMNS)}", source=name)
    return rows


def _price(where: str, gpu_name: str, fields: dict[str, object], name: str) -> GpuPrice:
    """One row's fields checked (see :func:`load_prices`); ``where`` names the row in errors."""
    csv_row = where.startswith("line ")

    def error(field: str, problem: str, fix: str | None = None) -> KvplanError:
        return KvplanError(f"{where}: {field}" if field else where, problem, fix, source=name)

    if not gpu_name.strip():
        raise error("gpu", "required field missing", "name a GPU of kvplan/sizing/data/gpus.yaml")
    try:
        gpu = canonical_gpu(gpu_name)
    except KvplanError:
        raise error("gpu" if csv_row else "", f"unknown GPU {gpu_name!r}", gpu_hint(gpu_name)) from None
    for field in _FIELDS:
        if field not in fields:
            raise error(field, "required field missing", f"give {', '.join(_FIELDS)}")
    raw = fields["usd_per_gpu_hour"]
    try:
        value = float(raw) if not isinstance(raw, bool) and isinstance(raw, (int, float, str)) else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise error("usd_per_gpu_hour", f"must be a number > 0 (got {raw!r})")
    source = fields["source"]
    if not isinstance(source, str) or not source.strip():
        raise error("source", f"must be a non-empty text (got {source!r})", "name the provider, offering and URL")
    date = fields["date"]
    if isinstance(date, dt.date) and not isinstance(date, dt.datetime):
        date = date.isoformat()  # YAML reads an unquoted 2026-11-09 as a date
    if not (isinstance(date, str) and _is_iso_date(date)):
        raise error("date", f"must be a date YYYY-MM-DD (got {date!r})")
    return GpuPrice(gpu=gpu, usd_per_gpu_hour=value, source=source.strip(), date=date)


def _is_iso_date(text: str) -> bool:
    try:
        dt.date.fromisoformat(text)
    except ValueError:
        return False
    return len(text) == 10  # fromisoformat also takes 20261109
