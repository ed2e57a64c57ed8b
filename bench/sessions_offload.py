"""Later-turn TTFT of workloads/sessions_offload.yaml without and with the host KV tier, from a
`kvplan loadtest` run folder: per engine variant, the TTFT P50 of turns 2 and later (and of first
turns), their prompt tokens and prefix-hit tokens, and a PNG of TTFT by turn.

TTFT is kvplan's (kvplan.results.stats.latency.ttft_s: first token time - arrival; a turn arrives
its think time after the previous turn finished). P50 is numpy's linear interpolation.

    flock /tmp/kvplan-cpu.lock .venv/bin/kvplan loadtest workloads/sessions_offload.yaml --out runs/so
    .venv/bin/python bench/sessions_offload.py runs/so [--png docs/img/sessions_offload_ttft.png]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def later_turns(run: Path) -> dict[str, dict]:
    """Per variant: TTFT (ms) per turn, and the later turns' P50 TTFT, prompt and prefix-hit tokens."""
    by_variant: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    tokens: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for line in (run / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if not r.get("token_times") or r.get("turn") is None:
            continue
        ttft_ms = (r["token_times"][0] - r["arrival_time"]) * 1e3
        by_variant[r["variant"]][r["turn"]].append(ttft_ms)
        if r["turn"] > 1:
            tokens[r["variant"]].append((r["num_prompt_tokens"], r["num_cached_tokens"]))
    out = {}
    for variant, turns in by_variant.items():
        later = [t for turn, values in turns.items() if turn > 1 for t in values]
        prompt, cached = (sum(x) for x in zip(*tokens[variant])) if tokens[variant] else (0, 0)
        out[variant] = {
            "first_turns": len(turns[1]),
            "first_turn_ttft_p50_ms": float(np.percentile(turns[1], 50)) if turns[1] else None,
            "later_turns": len(later),
            "later_turn_ttft_p50_ms": float(np.percentile(later, 50)) if later else None,
            "later_prompt_tokens": prompt,
            "later_cached_tokens": cached,
            "by_turn": {turn: values for turn, values in sorted(turns.items())},
        }
    return out


def plot(result: dict[str, dict], png: Path, pool_blocks: int | None = None) -> None:
    """TTFT of every turn by turn number, one marker per variant, the later-turn P50 as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (variant, data) in enumerate(result.items()):
        shift = (k - (len(result) - 1) / 2) * 0.15
        xs = [turn + shift for turn, values in data["by_turn"].items() for _ in values]
        ys = [v for values in data["by_turn"].values() for v in values]
        dots = ax.scatter(xs, ys, s=18, alpha=0.7, label=variant)
        p50 = data["later_turn_ttft_p50_ms"]
        if p50 is not None:
            ax.axhline(
                p50,
                color=dots.get_facecolor()[0],
                linestyle="--",
                linewidth=1,
                label=f"{variant}: later turns P50 {p50:.0f} ms",
            )
    ax.set_yscale("log")
    ax.set_xlabel("turn of the session")
    ax.set_ylabel("TTFT, ms (log)")
    pool = f", {pool_blocks}-block pool" if pool_blocks else ""
    ax.set_title(f"sessions_offload.yaml: SmolLM2-135M on a 2-core CPU{pool}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a kvplan loadtest --out folder of workloads/sessions_offload.yaml")
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    result = later_turns(args.run)
    for variant, data in result.items():
        print(variant, json.dumps({k: v for k, v in data.items() if k != "by_turn"}))
    if args.png is not None:
        import yaml

        engine = yaml.safe_load((args.run / "workload.yaml").read_text()).get("engine", {})
        plot(result, args.png, engine.get("num_blocks"))
        print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
