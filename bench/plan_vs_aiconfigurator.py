"""``kvplan plan`` beside aiconfigurator's ``cli recommend``: the same questions to both tools.

Each question: a model at a fixed ISL / OSL, N concurrent users, a TTFT and a TPOT SLO, on one
GPU kind, vLLM. Asked of

- kvplan: ``kvplan plan W --users N --gpus G --tp 1,2,4,8 --max-num-seqs 256,1024`` on a random
  dataset of exactly ISL / OSL tokens (steps timed from aiconfigurator-core's vLLM database);
- aiconfigurator 0.12.0 (the peer, in its own venv: ``--peer-bin``, default /tmp/aic/bin, made
  with ``pip install aiconfigurator==0.12.0`` when absent): ``cli recommend --target-concurrency N``,
  its aggregated (not disaggregated) top configuration (agg/best_config_topn.csv, first row).

Printed per question: each tool's TP, replicas and GPUs and its wall time; then each choice
judged by the other tool: kvplan's simulated SLO attainment of aiconfigurator's choice (a closed
loop of ceil(N / replicas) users on one replica, steady state), and aiconfigurator's
``cli estimate`` of kvplan's choice (TTFT, TPOT at that batch) against the SLO.

``--speed`` times instead the search of issue 22's size: 100 configurations (5 GPU kinds x 4 TP
x 5 ``max_num_seqs``: 32 to 512) of workloads/chat.yaml at 20 req/s on this machine's cores, beside
aiconfigurator's ``cli recommend`` over the same 5 GPU kinds (one run each) at the chat bucket's
mean ISL / OSL: the peer's wall time in the same run, and the ratio. ``--speed --baseline DIR``
also times the same search on another kvplan tree (a ``git archive`` of an earlier commit, imported
from DIR) in the same run, and checks that both trees' configurations (every field, in ranked
order) and best are identical.

    flock /tmp/kvplan-cpu.lock .venv/bin/python bench/plan_vs_aiconfigurator.py [--speed [--baseline DIR]]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEER = "aiconfigurator==0.12.0"
# kvplan preset -> the model id aiconfigurator's bundled configs name
PEER_MODEL = {"llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B", "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B"}
QUESTIONS = [  # (model, GPU): ISL 1,024, OSL 256, 200 users, TTFT 2 s, TPOT 30 ms (issue 22)
    ("llama-3.1-8b", "H100-SXM"),
    ("llama-3.1-8b", "H200"),
    ("llama-3.1-70b", "H100-SXM"),
    ("llama-3.1-70b", "H200"),
]
ISL, OSL, USERS, TTFT_MS, TPOT_MS = 1024, 256, 200, 2000.0, 30.0
SPEED_GPUS = ["H100-SXM", "H200", "B200", "A100-80GB", "L40S"]


def peer_bin(given: str | None) -> Path:
    """The folder holding the peer's ``aiconfigurator`` and ``python`` (made when absent)."""
    folder = Path(given or "/tmp/aic/bin")
    if (folder / "aiconfigurator").exists():
        return folder
    venv = Path(tempfile.mkdtemp(prefix="aiconfigurator-peer-"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", PEER], check=True)
    return venv / "bin"


def system_of(gpu: str) -> str:
    from kvplan.sizing.gpus.gpu_perf import lookup_gpu_perf

    return str(lookup_gpu_perf(gpu).silicon_system)


def workload_file(folder: Path, isl: int, osl: int) -> Path:
    """A random dataset of exactly ``isl`` / ``osl`` tokens with the questions' SLO."""
    import yaml

    path = folder / f"fixed_{isl}_{osl}.yaml"
    data = {
        "name": f"fixed-{isl}-{osl}",
        "seed": 0,
        "engine": {"model": "tiny-random-llama", "max_model_len": isl + osl + 16},
        "dataset": {"kind": "random"},
        "slo": {"ttft_ms": TTFT_MS, "tpot_ms": TPOT_MS},
        "buckets": [
            {"name": "fixed", "input_tokens": isl, "output_tokens": osl, "concurrency": [1], "num_requests": 64}
        ],
    }
    path.write_text(yaml.safe_dump(data))
    return path


# the tree's console script: kvplan.cli.script since 1e52876 (it ends the process without freeing
# every object), kvplan.cli.main before
SCRIPT = "import sys, kvplan.cli as cli; sys.argv[0] = 'kvplan'; getattr(cli, 'script', cli.main)()"


def kvplan_plan(
    workload: Path, model: str, gpus: list[str], load: list[str], seqs: str, out: Path, tree: Path = ROOT
) -> tuple[dict, float]:
    """``kvplan plan --json``'s object and its wall seconds, kvplan imported from ``tree``."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "plan", str(workload), "--model", model, *load]
        + ["--gpus", ",".join(gpus), "--tp", "1,2,4,8", "--max-num-seqs", seqs, "--json", "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,  # python -c puts its working folder first on sys.path
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    if done.returncode:
        raise SystemExit(f"kvplan plan failed: {done.stderr.strip()}")
    return json.loads(done.stdout), time.perf_counter() - started


def peer_recommend(peer: Path, model: str, gpu: str, isl: int, osl: int, users: int, out: Path) -> tuple[dict, float]:
    """aiconfigurator ``cli recommend``'s top aggregated configuration (tp, replicas, GPUs,
    per-replica concurrency, TTFT, TPOT) and its wall seconds."""
    started = time.perf_counter()
    subprocess.run(
        [str(peer / "aiconfigurator"), "cli", "recommend", "--model", PEER_MODEL[model], "--system", system_of(gpu)]
        + ["--backend", "vllm", "--isl", str(isl), "--osl", str(osl), "--ttft", str(TTFT_MS), "--tpot", str(TPOT_MS)]
        + ["--target-concurrency", str(users), "--save-dir", str(out), "--log-level", "ERROR"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    seconds = time.perf_counter() - started
    found = sorted(out.rglob("agg/best_config_topn.csv"))
    if not found:
        return {"reason": "no aggregated configuration"}, seconds
    with found[0].open() as handle:
        top = next(csv.DictReader(handle))
    return {
        "tp": int(top["tp"]),
        "replicas": int(top["replicas_needed"]),
        "gpus": int(top["total_gpus_needed"]),
        "concurrency": int(float(top["concurrency"])),
        "ttft_ms": float(top["ttft"]),
        "tpot_ms": float(top["tpot"]),
    }, seconds


PEER_ESTIMATE = r"""
import json, logging, sys
logging.disable(logging.WARNING)
from aiconfigurator.cli.api import cli_estimate
job = json.loads(sys.argv[1])
r = cli_estimate(job["model"], job["system"], mode="agg", backend_name="vllm", isl=job["isl"], osl=job["osl"],
                 batch_size=job["batch_size"], tp_size=job["tp"])
print(json.dumps({"ttft_ms": r.ttft, "tpot_ms": r.tpot}))
"""


def peer_estimate(peer: Path, model: str, gpu: str, tp: int, batch: int) -> dict:
    """aiconfigurator's ``cli estimate`` of one replica of ``tp`` GPUs at ``batch`` in flight."""
    job = {"model": PEER_MODEL[model], "system": system_of(gpu), "isl": ISL, "osl": OSL, "batch_size": batch, "tp": tp}
    done = subprocess.run(
        [str(peer / "python"), "-c", PEER_ESTIMATE, json.dumps(job)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"reason": done.stderr.strip().splitlines()[-1:]}


def kvplan_attainment(workload: Path, model: str, gpu: str, tp: int, users: int) -> tuple[float, float, float]:
    """kvplan's simulated SLO attainment, mean TTFT and mean TPOT (ms) of one replica of ``tp``
    GPUs with ``users`` in a closed loop (steady state; ``max_num_seqs`` 1024, vLLM's default)."""
    from kvplan.run.sim.gpu_target import gpu_setup
    from kvplan.run.sim.run import sample
    from kvplan.run.sim.search import Prober
    from kvplan.workload.file import load_workload

    spec = load_workload(workload)
    spec = spec.model_copy(update={"engine": spec.engine.model_copy(update={"max_num_seqs": max(1024, users)})})
    setup = gpu_setup(spec, model, gpu, tp)
    prober = Prober(spec, setup.facts, setup.clock, sample(spec, setup.facts).requests)
    level = prober.level(0, "closed", users, plan=prober.steady(users, 0))
    assert level is not None and level.ttft_ms is not None and level.tpot_ms is not None
    return level.slo_attainment or 0.0, level.ttft_ms.mean, level.tpot_ms.mean


def questions(peer: Path, folder: Path) -> None:
    workload = workload_file(folder, ISL, OSL)
    head = (
        f"{'question':28s} {'tool':15s} {'tp':>3s} {'replicas':>8s} {'GPUs':>5s} {'wall s':>7s}   judged by the other"
    )
    print(head)
    for model, gpu in QUESTIONS:
        name = f"{model} {gpu}"
        ours, our_s = kvplan_plan(workload, model, [gpu], ["--users", str(USERS)], "256,1024", folder / name)
        theirs, their_s = peer_recommend(peer, model, gpu, ISL, OSL, USERS, folder / f"peer {name}")
        best = ours["best"]
        if best is None:
            print(f"{name:28s} {'kvplan plan':15s} no configuration meets the SLO ({our_s:.1f} s)")
        else:
            batch = math.ceil(USERS / best["replicas"])
            judged = peer_estimate(peer, model, gpu, best["tp"], batch)
            verdict = (
                f"aiconfigurator estimate at {batch}/replica: TTFT {judged['ttft_ms']:.0f} ms,"
                f" TPOT {judged['tpot_ms']:.1f} ms"
                + (" (meets)" if judged["ttft_ms"] <= TTFT_MS and judged["tpot_ms"] <= TPOT_MS else " (misses)")
                if "ttft_ms" in judged
                else f"aiconfigurator estimate failed: {judged.get('reason')}"
            )
            print(
                f"{name:28s} {'kvplan plan':15s} {best['tp']:>3d} {best['replicas']:>8d} {best['num_gpus']:>5d}"
                f" {our_s:>7.1f}   {verdict}"
            )
        if "tp" not in theirs:
            print(f"{'':28s} {'aiconfigurator':15s} {theirs['reason']} ({their_s:.1f} s)")
            continue
        same = best is not None and (best["tp"], best["replicas"]) == (theirs["tp"], theirs["replicas"])
        users = math.ceil(USERS / theirs["replicas"])
        attained, ttft, tpot = kvplan_attainment(workload, model, gpu, theirs["tp"], users)
        verdict = (
            "the same choice"
            if same
            else f"kvplan simulates {users}/replica: attainment {attained:.0%},"
            f" mean TTFT {ttft:.0f} ms, TPOT {tpot:.1f} ms"
        )
        print(
            f"{'':28s} {'aiconfigurator':15s} {theirs['tp']:>3d} {theirs['replicas']:>8d} {theirs['gpus']:>5d}"
            f" {their_s:>7.1f}   {verdict} (its own: TTFT {theirs['ttft_ms']:.0f} ms, TPOT {theirs['tpot_ms']:.1f} ms)"
        )


def speed(peer: Path, folder: Path, baseline: Path | None = None) -> None:
    from kvplan.run.sim.facts import model_config
    from kvplan.traffic.samples import cached_sample
    from kvplan.traffic.tokenizer import tokenize_function, tokenizer_identity
    from kvplan.workload.file import load_workload

    chat = ROOT / "workloads" / "chat.yaml"
    spec = load_workload(chat)
    engine = spec.engine.model  # the chat bucket's requests, as kvplan plan samples them: their mean lengths
    requests = cached_sample(
        spec, lambda: tokenize_function(engine), model_config(engine).get("vocab_size") or 1, tokenizer_identity(engine)
    ).requests["short"]
    isl = round(sum(len(r.prompt_token_ids) for r in requests) / len(requests))
    osl = round(sum(r.max_tokens for r in requests) / len(requests))
    seqs = "32,64,128,256,512"
    ours, our_s = kvplan_plan(chat, "llama-3.1-8b", SPEED_GPUS, ["--rate", "20"], seqs, folder / "speed")
    print(f"kvplan plan: {len(ours['configs'])} configurations in {our_s:.1f} s on {os.cpu_count()} cores")
    if baseline is not None:
        theirs, their_s = kvplan_plan(
            chat, "llama-3.1-8b", SPEED_GPUS, ["--rate", "20"], seqs, folder / "speed-baseline", baseline
        )
        same = ours["configs"] == theirs["configs"] and ours["best"] == theirs["best"]
        differ = [
            f"{a['gpu']} x{a['tp']} seqs {a['max_num_seqs']}: {k}"
            for a, b in zip(ours["configs"], theirs["configs"], strict=True)
            for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)
        ]
        ratio = our_s / their_s
        print(f"baseline {baseline}: {len(theirs['configs'])} configurations in {their_s:.1f} s; ratio {ratio:.2f}")
        print(
            "answers: every configuration's fields, the ranking and the best identical"
            if same
            else f"answers DIFFER: {differ[:10]}"
        )
    total = 0.0
    for gpu in SPEED_GPUS:
        _, seconds = peer_recommend(peer, "llama-3.1-8b", gpu, isl, osl, 20, folder / f"peer speed {gpu}")
        total += seconds
        print(f"  aiconfigurator cli recommend {gpu} (ISL {isl}, OSL {osl}): {seconds:.1f} s")
    print(f"aiconfigurator: 5 GPU kinds in {total:.1f} s; kvplan / aiconfigurator wall time = {our_s / total:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-bin", help="bin folder of a venv with aiconfigurator==0.12.0")
    parser.add_argument("--speed", action="store_true", help="time the 100-configuration search instead")
    parser.add_argument("--baseline", type=Path, help="with --speed: also time a kvplan tree at this folder")
    args = parser.parse_args()
    stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    print(
        f"{stamp}, {platform.processor() or platform.machine()} ({os.cpu_count()} CPUs),"
        f" Python {platform.python_version()}"
    )
    peer = peer_bin(args.peer_bin)
    with tempfile.TemporaryDirectory(prefix="kvplan-plan-bench-") as tmp:
        if args.speed:
            speed(peer, Path(tmp), args.baseline)
        else:
            questions(peer, Path(tmp))


if __name__ == "__main__":
    main()
