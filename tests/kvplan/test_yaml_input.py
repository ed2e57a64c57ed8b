"""kvplan.yaml_input: every YAML kvplan reads takes YAML 1.2's numbers with an exponent as floats.

PyYAML resolves plain scalars by YAML 1.1, whose floats need a dot and a signed exponent, so
``1e9`` and ``1.0e9`` were strings. The expected values are the numbers as written.
"""

import pytest
import yaml

from kvplan.errors import KvplanError
from kvplan.sizing.gpus.prices import GpuPrice, load_prices
from kvplan.yaml_input import dump_yaml, load_data, read_yaml


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("1e9", 1_000_000_000.0),
        ("1.0e9", 1_000_000_000.0),
        ("-2.5E-3", -0.0025),
        ("1e+3", 1000.0),
        ("+4E2", 400.0),
        (".5e1", 5.0),
        ("3.e2", 300.0),
        ("1_000e-3", 1.0),  # YAML 1.1's underscores between digits, kept
        ("1.0e+9", 1_000_000_000.0),  # YAML 1.1 already read these
        ("1.5", 1.5),
    ],
)
def test_a_number_with_an_exponent_is_a_float(text, number):
    for value in (load_data(f"x: {text}")["x"], read_yaml(f"x: {text}", "t.yaml")["x"]):
        assert type(value) is float and value == number


def test_plain_pyyaml_reads_them_as_strings():
    """What the readers did before they shared the loader."""
    assert yaml.safe_load("[1e9, 1.0e9, -2E-3, 1e+3]") == ["1e9", "1.0e9", "-2E-3", "1e+3"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e9x", "1e9x"),
        ("0.12.0", "0.12.0"),
        ("e9", "e9"),
        ("1e", "1e"),
        ("1e9.5", "1e9.5"),
        ("'1e9'", "1e9"),
        ("inf", "inf"),
        (".inf", float("inf")),
        ("1_000", 1000),
        ("12", 12),
        ("2026-11-30", yaml.safe_load("2026-11-30")),  # a date, as before
    ],
)
def test_anything_else_resolves_as_before(text, value):
    assert load_data(f"x: {text}")["x"] == value and type(load_data(f"x: {text}")["x"]) is type(value)


def test_a_string_that_looks_like_a_number_is_quoted_when_written():
    data = {"name": "1e3", "version": "0.12.0", "rate": 1e20, "ttft_ms": 1e9}
    text = dump_yaml(data, sort_keys=False)
    assert text.splitlines()[0] == "name: '1e3'"
    assert load_data(text) == data


def test_the_unique_key_loader_still_refuses_a_key_given_twice():
    with pytest.raises(KvplanError, match=r"^t\.yaml: line 2: duplicate key 'a' \(first at line 1\)"):
        read_yaml("a: 1e3\na: 2e3\n", "t.yaml")


def test_a_prices_file_takes_an_exponent(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(
        "prices:\n  H100-SXM: {usd_per_gpu_hour: 2.5e0, source: 'a https://x.example', date: '2026-11-30'}\n"
    )
    assert load_prices(path) == {"H100-SXM": GpuPrice("H100-SXM", 2.5, "a https://x.example", "2026-11-30")}


def test_bundled_tables_read_on_libyaml_equal_the_python_loaders_reading():
    """``load_data`` (libyaml's parser where PyYAML has it) gives every bundled table exactly as
    YamlLoader gives it: the same values and types, exponents included."""
    from pathlib import Path

    from kvplan.yaml_input import YamlLoader

    tables = sorted((Path(__file__).resolve().parents[2] / "kvplan").rglob("*.yaml"))
    assert len(tables) >= 5
    for table in tables:
        text = table.read_text()
        assert repr(load_data(text)) == repr(yaml.load(text, Loader=YamlLoader)), table
    for text in ("a: 1e9", "a: 0.12.0", "a: .inf", "a: inf", "a: 1_000", "a: [1e+3, -2.5E-3, 1e9x]", "a: 2026-12-06"):
        assert repr(load_data(text)) == repr(yaml.load(text, Loader=YamlLoader)), text
