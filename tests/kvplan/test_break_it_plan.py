"""Break-it pass over ``kvplan plan`` and ``kvplan advise``: seeded generators of bad flags and bad
``--prices`` files, run through the CLI in-process. The search itself is replaced by a stub that
stops the command once every input was validated (``Accepted``), so each case fails at validation
or is accepted, fast; a case must exit 2 with one ``error:`` line and no traceback, or be accepted."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "workloads" / "smoke.yaml"  # the tiny random model, an SLO and a plan: entry
JUNK = [
    "", " ", ",", ",,", "0", "-1", "1e308", "1e999", "inf", "-inf", "nan", "10" * 20, "abc", "1,abc", "1.5",
    "😀", "x\ny", "\x00", "2,2,2", "1,-3", "0x10", "H100-SXMX", "h100", "auto,auto", "fp9", "1_000", "  8  ",
]  # fmt: skip
PLAN_FLAGS = {
    "--rate": ["0", "-5", "nan", "inf", "1e308", "abc", "", "1e-320"],
    "--users": ["0", "-1", "1.5", "abc", str(2**70)],
    "--gpus": ["H100-SXMX", ",", "", "h100,H100-SXM", "L4,😀", "A100", "x\ny"],
    "--max-gpus": ["0", "-1", "abc", str(2**70)],
    "--tp": ["two", "0", ",", "1,-2", "3", "1e3", "", str(2**70)],
    "--kv-cache-dtype": ["fp9", ",", "", "auto,fp9", "FP8"],
    "--weight-dtype": ["int3", ",", "", "auto,😀"],
    "--max-num-seqs": ["0", "-1", "a", ",", "1.5", str(10**30)],
    "--max-num-batched-tokens": ["0", "x", ",", "-8192"],
    "--bucket": ["nope", "", "SHORT", "x\ny"],
    "--attainment": ["0", "1.5", "-0.1", "nan", "inf", "abc"],
    "--jobs": ["0", "-3", "abc"],
}
PRICE_ENTRY = "{usd_per_gpu_hour: 2.5, source: 'my cloud https://x.example', date: '2026-11-30'}"


class Accepted(Exception):
    """The stubbed search was reached: every input was valid."""


@pytest.fixture
def stubbed(monkeypatch):
    def stop(*args, **kwargs):
        raise Accepted

    monkeypatch.setattr("kvplan.optimize.plan_pool.search", stop)
    monkeypatch.setattr("kvplan.optimize.advise.advise", _validate_then_stop)


def _validate_then_stop(workload, setup_for, **kwargs):
    setup_for(workload, None)  # the base setup checks every --gpu option (kvplan.run.sim.cli_setup)
    raise Accepted


def bad_prices(rng: random.Random) -> tuple[str, str]:
    """(a suffix, a prices file's text) with something wrong in it."""
    if rng.random() < 0.3:  # CSV
        rows = ["gpu,usd_per_gpu_hour,source,date", "H100-SXM,2.5,my cloud,2026-11-30"]
        broken = rng.choice([
            "H100-SXM,2.5,again,2026-11-30", "H100-SXMX,2.5,s,2026-11-30", ",2.5,s,2026-11-30",
            "L4,-1,s,2026-11-30", "L4,nan,s,2026-11-30", "L4,inf,s,2026-11-30", "L4,abc,s,2026-11-30",
            "L4,2.5,,2026-11-30", "L4,2.5,s,2026-13-01", "L4,2.5,s,20261130", "L4,2.5,s,2026-11-30,extra",
            "L4", '"L4,2.5', "\x00,1,s,2026-11-30",
        ])  # fmt: skip
        rows = rng.choice([[rows[0], broken], [*rows, broken], ["gpu,price", "L4,1"], [], ["\ufeff" + rows[0]]])
        return ".csv", "\n".join(rows) + "\n"
    gpu, field, value = (
        rng.choice(["H100-SXM", "H100-SXMX", '"x\\ny"', "''", "1", "null", "[a]", "😀", '"H100\\tSXM"', '"L4\\r"']),
        rng.choice(["usd_per_gpu_hour", "source", "date", "bogus", '"a\\nb"']),
        rng.choice(["-1", "0", ".nan", ".inf", "'abc'", "null", "[]", "{}", "''", "2026-13-01", "true", "1e999"]),
    )
    text = rng.choice([
        f"prices:\n  {gpu}: {{{field}: {value}}}\n",
        f"prices:\n  {gpu}: {PRICE_ENTRY}\n  L4: {{usd_per_gpu_hour: {value}, source: s, date: '2026-11-30'}}\n",
        f"prices:\n  H100-SXM: {PRICE_ENTRY}\n  h100: {PRICE_ENTRY}\n",  # one GPU twice, by an alias
        f"prices:\n  L4: {PRICE_ENTRY}\n  L4: {PRICE_ENTRY}\n",
        f"prices:\n  {gpu}: {value}\n", "prices: []\n", "prices: {}\n", "", "[1, 2]\n", "prices:\n  L4: {a: [}\n",
        "\x00\x01binary", "prices: !!python/object:os.system {}\n", f"prices:\n  L4: {PRICE_ENTRY}\r\n  {gpu}: 1\r\n",
    ])  # fmt: skip
    return ".yaml", text


def _run(failures: list[str], args: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of ``kvplan ARGS``; 0 when the stubbed search was reached."""
    start = time.perf_counter()
    try:
        code, out, err = run_cli(*args)
    except Accepted:
        return 0, ""
    except Exception as exc:  # noqa: BLE001 - what main() let through: a traceback
        failures.append(f"{args}: {type(exc).__name__}: {exc}"[:400])
        return -1, ""
    lines = err.strip().splitlines()
    if code != 2 or "Traceback" in err + out or len(lines) != 1 or not lines[0].startswith("error: "):
        failures.append(f"{args}: exit {code}, stderr {err[-400:]!r}")
    if time.perf_counter() - start > 10:
        failures.append(f"{args}: took {time.perf_counter() - start:.1f} s")
    return code, err


def test_250_generated_bad_plan_flags_and_prices_files_fail_in_one_line(stubbed, tmp_path):
    rng, failures, refused = random.Random(11), [], 0
    for i in range(250):
        args = ["plan", str(SMOKE), "--out", str(tmp_path / f"run{i}")]
        flags = rng.sample(sorted(PLAN_FLAGS), rng.choice([1, 1, 2]))
        if "--users" not in flags and "--rate" not in flags:
            args += ["--rate", "5"]
        for flag in flags:
            args += [flag, rng.choice(PLAN_FLAGS[flag] + JUNK[:8])]
        if rng.random() < 0.4:
            suffix, text = bad_prices(rng)
            (prices := tmp_path / f"prices{i}{suffix}").write_text(text)
            args += ["--prices", str(prices)]
        refused += _run(failures, args)[0] == 2
    assert refused >= 200, refused
    assert not failures, "\n".join(failures[:20])


def test_250_generated_bad_prices_files_name_the_file_and_the_entry(stubbed, tmp_path):
    rng, failures = random.Random(12), []
    for i in range(250):
        suffix, text = bad_prices(rng)
        (prices := tmp_path / f"prices{i}{suffix}").write_text(text)
        run = str(tmp_path / f"run{i}")
        code, err = _run(failures, ["plan", str(SMOKE), "--rate", "5", "--prices", str(prices), "--out", run])
        if code == 2 and not err.startswith((f"error: {prices.name}: ", "error: --prices: ")):
            failures.append(f"{text!r}: does not name the file: {err!r}")
    assert not failures, "\n".join(failures[:20])


ADVISE_FLAGS = {
    "--model": ["llama-3.1-8b", "nope-model", "", "x\ny", "/no/such/config.json", "😀"],
    "--gpu": ["H100-SXM", "H100-SXMX", "", ",", "x\ny"],
    "--tp": ["0", "-1", "3", "abc", "1.5", str(2**70)],
    "--kv-cache-dtype": ["fp9", "", "auto,fp8", "FP8"],
    "--weight-dtype": ["int3", "", "😀"],
    "--backend": ["vllm2", "", "SGLANG", "x\ny"],
    "--calibrate": ["/no/such/run", str(ROOT / "workloads"), ""],
    "--attainment": ["0", "1.5", "-1", "nan", "inf", "abc"],
}


def test_250_generated_bad_advise_flags_fail_in_one_line(stubbed, tmp_path):
    rng, failures, refused = random.Random(13), [], 0
    for _ in range(250):
        args = ["advise", str(SMOKE)]
        for flag in rng.sample(sorted(ADVISE_FLAGS), rng.choice([1, 2, 3])):
            args += [flag, rng.choice(ADVISE_FLAGS[flag] + JUNK[:6])]
        refused += _run(failures, args)[0] == 2
    assert refused >= 200, refused
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize(
    "text, line",
    [
        (
            'prices:\n  "H100\\nSXM": {usd_per_gpu_hour: 1, source: s, date: "2026-11-30"}\n',
            "'H100\\nSXM': unknown GPU",
        ),
        ('prices:\n  L4: {"a\\nb": 1}\n', "L4: 'a\\nb': unknown field"),
        ('prices:\n  "L4\\nx": {usd_per_gpu_hour: 1}\n  "L4\\nx": 2\n', "'L4\\nx': 'L4\\nx' is given twice"),
    ],
)
def test_a_prices_key_with_a_line_break_is_quoted_in_one_line(tmp_path, text, line):
    """Found by the generator: the key went into the error as written, its line break splitting the
    error over two lines (kvplan.sizing.gpus.prices now quotes an unprintable key)."""
    (prices := tmp_path / "p.yaml").write_text(text)
    code, _, err = run_cli("plan", str(SMOKE), "--rate", "5", "--prices", str(prices), "--out", str(tmp_path / "r"))
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: p.yaml: {line}"), err
