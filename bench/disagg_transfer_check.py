"""kvplan's KV transfer price, and its disaggregated TTFT, against Mooncake's published vLLM v1 PD table.

The source (its facts only): github kvcache-ai/Mooncake, the page "vLLM with Mooncake Transfer
Engine Benchmark" (docs/source, 2025): vLLM 0.11.2.dev358 with MooncakeConnector, Qwen3-8B, one
prefill and one decode instance of tp 8 on two H800 nodes, 8 x ConnectX-7 RoCE ("theoretical
maximum bandwidth of approximately 200 GB/s for the 8x RoCE connections": 25 GB/s a GPU, kvplan's
``rdma-200g``), prefix caching off, vLLM's toy proxy between them; ``vllm bench serve`` random
prompts, 128 output tokens, 50 prompts at concurrency 1, chat endpoint, at nine prompt lengths.
TABLE holds its "Detailed Performance Data": prompt length, mean TTFT (ms), KV size (as printed,
MB/GB of 2**20/2**30 bytes), actual transfer time (ms).

The link ``mooncake-rdma-200g`` of kvplan/sizing/data/links.yaml is this table's connector:
``--fit`` fits its setup and a rank's bandwidth (least relative error) on five of the nine rows
(every other one, from 128 tokens) and prints the error on the other four.

Two checks, printed side by side with the measured figures (error % = kvplan / measured - 1):

1. **Transfer alone.** kvplan's price of moving the table's KV size: each of the 8 ranks moves its
   eighth over its own link at once (kvplan.sizing.gpus.links.Link.seconds: setup + bytes /
   bandwidth) on ``rdma-200g``. The measured KV sizes are those of the prompt plus about 14 tokens
   (Qwen3-8B's KV is 147,456 bytes a token: 36 layers x 2 x 8 KV heads x 128 x 2 bytes), which the
   chat template adds; the price uses the measured size, so only the link model is checked.
2. **TTFT.** ``kvplan simulate``'s disaggregated target (1 prefill + 1 decode worker, tp 8 each,
   H100-SXM: the H800 has the H100 SXM's compute and HBM, and a slower NVLink that tp 8 inside one
   node uses; vLLM's measured step times) on the same benchmark (prompt + 14 tokens, 128 out,
   concurrency 1, 50 requests), with the client's first token from the prefill worker (kvplan's
   bundled router) and from the decode worker (vLLM's proxies, which this benchmark used).

    .venv/bin/python bench/disagg_transfer_check.py [--link NAME] [--fit]
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MIB, GIB = 2**20, 2**30
# prompt tokens, mean TTFT ms, KV size bytes, transfer ms (Mooncake's table, as printed)
TABLE = [
    (128, 46.09, 20 * MIB, 0.54),
    (256, 48.04, 38 * MIB, 0.61),
    (512, 59.91, 74 * MIB, 0.92),
    (1024, 67.29, 146 * MIB, 1.50),
    (2048, 85.31, 290 * MIB, 2.51),
    (4096, 124.42, 578 * MIB, 4.75),
    (8192, 212.05, 1.13 * GIB, 8.84),
    (16384, 387.52, 2.25 * GIB, 16.43),
    (32768, 749.62, 4.50 * GIB, 31.65),
]
TP, LINK, TEMPLATE_TOKENS = 8, "rdma-200g", 14


def simulated_ttft_ms(prompt: int, first_token: str, link: str = LINK) -> float:
    """Mean TTFT (ms) of the benchmark at ``prompt`` tokens on the disaggregated target."""
    from kvplan.run.sim.gpu_target import disagg_setup
    from kvplan.run.sim.run import sample
    from kvplan.run.sim.search import Prober
    from kvplan.workload.file import parse_workload

    tokens = prompt + TEMPLATE_TOKENS
    workload = parse_workload(
        {
            "name": "mooncake-pd",
            "engine": {
                "model": "tiny-random-llama",
                "max_model_len": tokens + 160,
                "max_num_batched_tokens": 8192,
                "enable_prefix_caching": False,
            },
            "dataset": {"kind": "random"},
            "buckets": [
                {"name": "b", "input_tokens": tokens, "output_tokens": 128, "concurrency": [1], "num_requests": 50}
            ],
            "plan": [
                {
                    "model": "qwen3-8b",
                    "gpu": "H100-SXM",
                    "tp": TP,
                    "backend": "vllm",
                    "disagg": {
                        "prefill": {"workers": 1},
                        "decode": {"workers": 1},
                        "link": link,
                        "first_token": first_token,
                    },
                }
            ],
        }
    )
    setup = disagg_setup(workload, workload.plan[0], "plan[0]")
    prober = Prober(workload, setup.facts, setup.clock, sample(workload, setup.facts).requests, setup.make_backend)
    level = prober.level(0, "closed", 1)
    assert level is not None and level.ttft_ms is not None
    return level.ttft_ms.mean


def fit_link() -> None:
    """Setup (us) and bandwidth (GB/s a rank) fitted on every other row, checked on the rest."""
    import numpy as np

    fit, check = TABLE[0::2], TABLE[1::2]
    x = np.array([size / TP for _, _, size, _ in fit])
    y = np.array([ms / 1e3 for *_, ms in fit])
    (setup, per_byte), *_ = np.linalg.lstsq(np.vstack([np.ones_like(x), x]).T / y[:, None], np.ones_like(y), rcond=None)
    print(f"fitted on {[p for p, *_ in fit]} tokens: setup {setup * 1e6:.0f} us, {1 / per_byte / 1e9:.1f} GB/s a rank")
    for prompt, _, size, ms in check:
        ours = (setup + per_byte * size / TP) * 1e3
        error = 100 * (ours / ms - 1)
        print(f"  held out {prompt:6d} tokens: measured {ms:6.2f} ms, fitted link {ours:6.2f} ms ({error:+.0f} %)")


def main() -> None:
    from kvplan.sizing.gpus.links import lookup_link

    if "--fit" in sys.argv:
        fit_link()
        return
    link = lookup_link(sys.argv[sys.argv.index("--link") + 1] if "--link" in sys.argv else LINK)
    print(f"{date.today()} on {platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()})")
    print(f"link {link.name}: {link.bytes_per_s / 1e9:g} GB/s a rank, setup {link.setup_s * 1e6:g} us; tp {TP}\n")
    cols = ("xfer ms", "kvplan", "err%", "|", "TTFT ms", "prefill", "err%", "decode", "err%")
    head = f"{'prompt':>7s} {'KV MiB':>8s} | " + " ".join(c if c == "|" else f"{c:>8s}" for c in cols)
    print(head)
    errs: dict[str, list[float]] = {"xfer": [], "prefill": [], "decode": []}
    for prompt, ttft, size, xfer in TABLE:
        ours = link.seconds(size / TP) * 1e3
        ttfts = {mode: simulated_ttft_ms(prompt, mode, link.name) for mode in ("prefill", "decode")}
        errs["xfer"].append(ours / xfer - 1)
        for mode in ttfts:
            errs[mode].append(ttfts[mode] / ttft - 1)
        print(
            f"{prompt:7d} {size / MIB:8.0f} | {xfer:8.2f} {ours:7.2f} {100 * (ours / xfer - 1):+6.0f} |"
            f" {ttft:8.2f} {ttfts['prefill']:8.2f} {100 * (ttfts['prefill'] / ttft - 1):+6.0f}"
            f" {ttfts['decode']:8.2f} {100 * (ttfts['decode'] / ttft - 1):+6.0f}"
        )
    med = {k: sorted(abs(x) for x in v)[len(v) // 2] * 100 for k, v in errs.items()}
    print(
        f"\nmedian |error|: transfer {med['xfer']:.0f} %, TTFT with token 1 from prefill {med['prefill']:.0f} %,"
        f" from decode {med['decode']:.0f} %"
    )


if __name__ == "__main__":
    main()
