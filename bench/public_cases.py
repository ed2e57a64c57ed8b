"""The public serving benchmarks (tests/kvplan/data/public_serving_benchmarks.yaml) as
simulations: each record's model, GPU, tp, engine limits and load become a
workload for ``kvplan simulate``'s GPU roofline, and its published numbers the answers to predict.

How each record is read (the published numbers are never touched; only the load is rebuilt):

- lengths: fixed where the source says so (random 1024/1024, TRT-LLM 467/256, Qwen's 1 -> 2048);
  nano-vllm's bench.py draws uniform [100, 1024] inputs and outputs; ShareGPT records use the mean
  lengths gpustack printed for 100 ShareGPT prompts (23,260 input, 22,061 output tokens: 233 and
  221 per request) as lognormals (std 250 and 200) clipped to vLLM's filter [4, 1024];
- load: ``max_concurrency`` N -> closed loop at N; a burst (rate inf) of n requests -> closed loop
  at n (the server's max_num_seqs admits what fits); a rate -> open loop (Poisson) at that rate;
- engine limits: as the source states them, else the engine version's defaults (vLLM V1 on an
  80 GB GPU: max_num_seqs 1024 and max_num_batched_tokens 8192 for a server; V0 and unstated:
  256 sequences; TRT-LLM: 256 and 8192), block size 16 (nano-vllm's 256), 0.9 of GPU memory;
- what is compared: output tok/s where printed; TPOT P50 as printed, else TRT-LLM's mean ITL
  against the mean TPOT, else Qwen's per-token time (1000 / tokens/s) against the mean TPOT; TTFT
  P50 (or mean) is printed too, not fitted (API and HTTP time is not in the roofline).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from kvplan.workload.file import parse_workload
from kvplan.workload.schema import Workload

CASES_FILE = Path(__file__).resolve().parents[1] / "tests" / "kvplan" / "data" / "public_serving_benchmarks.yaml"
SHAREGPT_IN = {"min": 4, "max": 1024, "dist": "lognormal", "mean": 233, "std": 250}
SHAREGPT_OUT = {"min": 4, "max": 1024, "dist": "lognormal", "mean": 221, "std": 200}
# record id -> how it is simulated: model preset, GPU, tp, engine section, lengths, load
SETUPS = {
    "nanovllm-readme-qwen3-0.6b-rtx4070laptop-offline256-vllm": dict(
        model="qwen3-0.6b",
        gpu="RTX-4070-Laptop",
        engine=dict(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=4096),
        input=[100, 1024],
        output=[100, 1024],
        requests=256,
        concurrency=256,
    ),
    "nanovllm-readme-qwen3-0.6b-rtx4070laptop-offline256-nanovllm": dict(
        model="qwen3-0.6b",
        gpu="RTX-4070-Laptop",
        engine=dict(block_size=256, max_num_seqs=512, max_num_batched_tokens=32768, max_model_len=4096),
        input=[100, 1024],
        output=[100, 1024],
        requests=256,
        concurrency=256,
    ),
    **{
        f"qwen25-speed-qwen2.5-{size}-a100-bs1-out2048-vllm063": dict(
            model=f"qwen2.5-{size.lower()}" if size != "7b" else "qwen2.5-7b",
            gpu="A100-80GB",
            engine=dict(max_num_seqs=256, max_num_batched_tokens=32768, max_model_len=32768),
            input=1,
            output=2048,
            requests=1,
            concurrency=1,
        )
        for size in ("0.5b", "1.5b", "3b", "7b")
    },
    "gpustack-qwen3-8b-h100-vllm0110-sharegpt100-c1": dict(
        model="qwen3-8b",
        gpu="H100-SXM",
        engine=dict(max_num_seqs=1024, max_num_batched_tokens=8192, max_model_len=40960),
        input=SHAREGPT_IN,
        output=SHAREGPT_OUT,
        requests=100,
        concurrency=1,
    ),
    "gpustack-qwen3-8b-h100-vllm0110-sharegpt100-c4": dict(
        model="qwen3-8b",
        gpu="H100-SXM",
        engine=dict(max_num_seqs=1024, max_num_batched_tokens=8192, max_model_len=40960),
        input=SHAREGPT_IN,
        output=SHAREGPT_OUT,
        requests=100,
        concurrency=4,
    ),
    "dennislee-qwen2-7b-a100-80g-vllm01011-random1k1k-n1": dict(
        model="qwen2-7b",
        gpu="A100-80GB",
        utilization=0.5,
        engine=dict(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=16384, enable_prefix_caching=True),
        input=1024,
        output=1024,
        requests=1,
        concurrency=1,
    ),
    "dennislee-qwen2-7b-a100-80g-vllm01011-random1k1k-burst100": dict(
        model="qwen2-7b",
        gpu="A100-80GB",
        utilization=0.5,
        engine=dict(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=16384, enable_prefix_caching=True),
        input=1024,
        output=1016,
        requests=100,
        concurrency=100,
    ),
    "trtllm-docs-llama31-8b-h100-trtllm014-467x256-qps2": dict(
        model="llama-3.1-8b",
        gpu="H100-SXM",
        engine=dict(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192),
        input=467,
        output=256,
        requests=500,
        rate=2.0,
    ),
    "trtllm-docs-llama31-8b-h100-trtllm014-467x256-qpsinf": dict(
        model="llama-3.1-8b",
        gpu="H100-SXM",
        engine=dict(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192),
        input=467,
        output=256,
        requests=500,
        concurrency=500,
    ),
    "sglang-bench060-llama31-70b-4xh100-tp4-vllm060-sharegpt-rps4": dict(
        model="llama-3.1-70b",
        gpu="H100-SXM",
        tp=4,
        engine=dict(max_num_seqs=256, max_num_batched_tokens=4096, max_model_len=4096),
        input=SHAREGPT_IN,
        output=SHAREGPT_OUT,
        requests=400,
        rate=4.0,
    ),
}


@dataclass(frozen=True)
class Case:
    """One public record as a simulation: ``workload`` (tiny-random-llama names the engine
    section; the GPU setup replaces model and pool), the target, and the published numbers:
    ``output_tok_s``, ``tpot_ms`` (compared with ``tpot_stat`` of the simulation: p50 or mean),
    ``ttft_ms`` (with ``ttft_stat``)."""

    id: str
    workload: Workload
    model: str
    gpu: str
    tp: int
    utilization: float | None
    output_tok_s: float | None
    tpot_ms: float | None
    tpot_stat: str
    ttft_ms: float | None
    ttft_stat: str


def _published(record: dict) -> tuple:
    measured, derived = record["measured"], record.get("derived") or {}
    tpot, ttft = measured.get("tpot_ms") or {}, measured.get("ttft_ms") or {}
    if "median" in tpot:
        tpot_ms, tpot_stat = tpot["median"], "p50"
    elif "mean" in (measured.get("itl_ms") or {}):
        tpot_ms, tpot_stat = measured["itl_ms"]["mean"], "mean"
    else:
        tpot_ms, tpot_stat = derived.get("time_per_token_ms"), "mean"
    ttft_ms, ttft_stat = (ttft["median"], "p50") if "median" in ttft else (ttft.get("mean"), "mean")
    return measured.get("output_tok_s"), tpot_ms, tpot_stat, ttft_ms, ttft_stat


def load_cases(path: Path = CASES_FILE) -> list[Case]:
    """Every record of the public set that SETUPS knows, as a Case (in file order)."""
    cases = []
    for record in yaml.safe_load(path.read_text())["cases"]:
        setup = SETUPS[record["id"]]
        engine = {"model": "tiny-random-llama", "block_size": 16, "enable_prefix_caching": False, **setup["engine"]}
        level = (
            {"concurrency": [setup["concurrency"]]} if "concurrency" in setup else {"request_rates": [setup["rate"]]}
        )
        workload = parse_workload(
            {
                "name": record["id"][:200],
                "seed": 0,
                "engine": engine,
                "dataset": "random",
                "slo": {"ttft_ms": 1e9},
                "buckets": [
                    {
                        "name": "b",
                        "input_tokens": setup["input"],
                        "output_tokens": setup["output"],
                        "num_requests": setup["requests"],
                        **level,
                    }
                ],
            }
        )
        cases.append(
            Case(
                record["id"],
                workload,
                setup["model"],
                setup["gpu"],
                setup.get("tp", 1),
                setup.get("utilization"),
                *_published(record),
            )
        )
    return cases
