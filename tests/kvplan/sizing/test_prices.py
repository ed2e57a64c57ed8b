"""GPU prices: the shipped table against its own sources, and bad price files as one-line errors."""

import datetime as dt
import re

import pytest
import yaml

from kvplan.errors import KvplanError
from kvplan.sizing.gpus.gpus import gpu_table
from kvplan.sizing.gpus.prices import PRICES_FILE, GpuPrice, load_prices

SHIPPED = load_prices()
# "8 GPUs: $55.04/h" (an instance price over its GPU count) or "per GPU: $3.29/GPU-h" (sold per GPU)
INSTANCE = re.compile(r"\b(\d+) GPUs?: \$(\d+(?:\.\d+)?)/h\b")
PER_GPU = re.compile(r"\bper GPU: \$(\d+(?:\.\d+)?)/GPU-h\b")


def test_the_shipped_file_loads_keyed_by_canonical_names():
    raw = yaml.safe_load(PRICES_FILE.read_text())["prices"]
    assert list(SHIPPED) == list(raw)  # the file already uses canonical names, no alias
    assert set(SHIPPED) <= set(gpu_table())
    assert {"H100-SXM", "A100-80GB", "H200"} <= set(SHIPPED)
    assert all(isinstance(p, GpuPrice) and p.gpu == name for name, p in SHIPPED.items())


@pytest.mark.parametrize("gpu", sorted(SHIPPED))
def test_each_price_has_a_url_and_a_date(gpu):
    price = SHIPPED[gpu]
    assert re.search(r"https://\S+\.\S+", price.source), price.source
    assert dt.date(2025, 1, 1) <= dt.date.fromisoformat(price.date) <= dt.date(2026, 12, 31)


@pytest.mark.parametrize("gpu", sorted(SHIPPED))
def test_the_per_gpu_figure_follows_from_the_source(gpu):
    """Instance price / GPU count, rounded to 4 decimals (the file's header), or the per-GPU price as listed."""
    price = SHIPPED[gpu]
    instance, per_gpu = INSTANCE.findall(price.source), PER_GPU.findall(price.source)
    assert len(instance) + len(per_gpu) == 1, price.source
    if instance:
        ((count, usd_per_hour),) = instance
        assert price.usd_per_gpu_hour == round(float(usd_per_hour) / int(count), 4)
    else:
        assert price.usd_per_gpu_hour == float(per_gpu[0])


def test_the_division_by_hand():
    # p5.48xlarge: 55.04 / 8 = 6.88; p4de.24xlarge: 27.44705 / 8 = 3.43088125 -> 3.4309
    assert SHIPPED["H100-SXM"].usd_per_gpu_hour == 6.88
    assert SHIPPED["A100-80GB"].usd_per_gpu_hour == 3.4309
    assert SHIPPED["H200"].usd_per_gpu_hour == 7.912  # p5en.48xlarge: 63.296 / 8


def test_a_user_yaml_and_csv_read_alike(tmp_path):
    (tmp_path / "prices.yaml").write_text(
        "prices:\n  h100_80gb: {usd_per_gpu_hour: 2.5, source: 'my cloud https://x.example', date: 2026-11-30}\n"
    )
    (tmp_path / "prices.csv").write_text(
        'gpu,usd_per_gpu_hour,source,date\nH100-80GB,2.5,"my cloud, https://x.example",2026-11-30\n'
    )
    from_yaml = load_prices(tmp_path / "prices.yaml")
    from_csv = load_prices(tmp_path / "prices.csv")
    assert from_yaml == {"H100-SXM": GpuPrice("H100-SXM", 2.5, "my cloud https://x.example", "2026-11-30")}
    assert from_csv == {"H100-SXM": GpuPrice("H100-SXM", 2.5, "my cloud, https://x.example", "2026-11-30")}


YAML_ENTRY = "source: 'a https://x.example'"


@pytest.mark.parametrize(
    "text, message",
    [
        (
            f"prices:\n  H100-SXM: {{usd_per_gpu_hour: cheap, {YAML_ENTRY}, date: '2026-11-30'}}\n",
            "prices.yaml: H100-SXM: usd_per_gpu_hour: must be a number > 0 (got 'cheap')",
        ),
        (
            f"prices:\n  H100-SXM: {{usd_per_gpu_hour: 0, {YAML_ENTRY}, date: '2026-11-30'}}\n",
            "prices.yaml: H100-SXM: usd_per_gpu_hour: must be a number > 0 (got 0)",
        ),
        (
            f"prices:\n  H100-SXM: {{usd_per_gpu_hour: 2, {YAML_ENTRY}}}\n",
            "prices.yaml: H100-SXM: date: required field missing; give usd_per_gpu_hour, source, date",
        ),
        (
            f"prices:\n  H100-SXM: {{usd_per_gpu_hour: 2, {YAML_ENTRY}, date: 'last week'}}\n",
            "prices.yaml: H100-SXM: date: must be a date YYYY-MM-DD (got 'last week')",
        ),
        (
            f"prices:\n  H100-SXM: {{usd_per_gpu_hour: 2, {YAML_ENTRY}, date: '2026-11-30', region: x}}\n",
            "prices.yaml: H100-SXM: region: unknown field; give usd_per_gpu_hour, source, date",
        ),
        (
            f"prices:\n  H100-SXM: {{usd_per_gpu_hour: 2, {YAML_ENTRY}, date: '2026-11-30'}}\n"
            f"  H100-SXM5: {{usd_per_gpu_hour: 3, {YAML_ENTRY}, date: '2026-11-30'}}\n",
            "prices.yaml: H100-SXM5: H100-SXM is priced twice; keep one entry per GPU",
        ),
        (  # the same key twice: PyYAML alone would keep the second silently
            f"prices:\n  H100-SXM: {{usd_per_gpu_hour: 2, {YAML_ENTRY}, date: '2026-11-30'}}\n"
            f"  H100-SXM: {{usd_per_gpu_hour: 3, {YAML_ENTRY}, date: '2026-11-30'}}\n",
            "prices.yaml: H100-SXM: H100-SXM is given twice; keep one entry per GPU",
        ),
        ("prices:\n  H100-SXM: {usd_per_gpu_hour: 2, source: x, date: 2026-13-01}\n", "prices.yaml: date: not a date"),
        ("gpus: {}\n", "prices.yaml: prices: must be a mapping of GPU name -> entry"),
    ],
)
def test_bad_yaml_is_one_line(tmp_path, text, message):
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(KvplanError) as err:
        load_prices(path)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_an_unknown_gpu_lists_close_names(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(f"prices:\n  H100: {{usd_per_gpu_hour: 2, {YAML_ENTRY}, date: '2026-11-30'}}\n")
    with pytest.raises(KvplanError) as err:
        load_prices(path)
    line = str(err.value)
    assert line.startswith("prices.yaml: H100: unknown GPU 'H100'; closest: ")
    assert "H100-SXM" in line.split("closest: ")[1] and "\n" not in line


def test_yaml_that_does_not_parse(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text("prices:\n  H100-SXM: {usd_per_gpu_hour: 2\n")
    with pytest.raises(KvplanError, match=r"^prices\.yaml: not valid YAML \(") as err:
        load_prices(path)
    assert "\n" not in str(err.value)


HEADER = "gpu,usd_per_gpu_hour,source,date\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "gpu,source,date\nH100-SXM,a https://x.example,2026-11-30\n",
            "prices.csv: missing column usd_per_gpu_hour; give gpu,usd_per_gpu_hour,source,date",
        ),
        (
            HEADER + "L4,0.8,a https://x.example,2026-11-30\nH100-SXM,cheap,a https://x.example,2026-11-30\n",
            "prices.csv: line 3: usd_per_gpu_hour: must be a number > 0 (got 'cheap')",
        ),
        (
            HEADER + "H100-SXM,2,,2026-11-30\n",
            "prices.csv: line 2: source: required field missing",
        ),
        (
            HEADER + "B20,2,a https://x.example,2026-11-30\n",
            "prices.csv: line 2: gpu: unknown GPU 'B20'; closest: ",
        ),
        (
            HEADER + "H100-SXM,2,a, https://x.example,2026-11-30\n",
            "prices.csv: line 2: more than 4 values; quote values that hold commas",
        ),
        (HEADER, "prices.csv: no prices"),
    ],
)
def test_bad_csv_is_one_line(tmp_path, text, message):
    path = tmp_path / "prices.csv"
    path.write_text(text)
    with pytest.raises(KvplanError) as err:
        load_prices(path)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_a_missing_file_names_the_option(tmp_path):
    with pytest.raises(KvplanError) as err:
        load_prices(tmp_path / "nope.yaml")
    assert err.value.field == "prices" and "nope.yaml" in err.value.problem
