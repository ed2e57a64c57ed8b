"""The GPU roofline with its fitted constants predicts the public measured serving results
(tests/kvplan/data/public_serving_benchmarks.yaml, 13 records: vLLM, SGLang, TensorRT-LLM and
nano-vllm on an RTX 4070 Laptop, A100 and H100, 0.5B-70B, tp 1 and 4) within a median |error|
of 25 % on output tok/s and on TPOT. Each record's error is printed (pytest -s shows it; so does
bench/gpu_cost_fit.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from bench.gpu_cost_fit import evaluate, medians, print_rows  # noqa: E402
from bench.public_cases import load_cases  # noqa: E402
from kvplan.sizing.gpus.gpu_perf import serving_fit  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return evaluate(load_cases(), serving_fit())


def test_every_public_record_is_simulated(rows):
    assert len(rows) == 13
    assert sum(r["err_output_tok_s"] is not None for r in rows) == 12  # the SGLang record prints no tok/s
    assert sum(r["err_tpot_ms"] is not None for r in rows) == 11  # nano-vllm's print no latency


def test_median_error_on_output_throughput_and_tpot_is_at_most_25_percent(rows):
    print_rows(rows, serving_fit())
    m = medians(rows)
    assert m["output_tok_s"] <= 25 and m["tpot_ms"] <= 25, m
