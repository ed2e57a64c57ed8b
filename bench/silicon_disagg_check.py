"""kvplan simulate's disaggregated targets against measured disaggregated serving runs, beside aiconfigurator.

The check set is tests/kvplan/data/silicon_disagg.yaml: the 274 disaggregated runs of
aiconfigurator-core 0.12.0's measured sample that give both pools (bench/silicon_disagg_extract.py;
its header says how they were chosen). A row with a ``replay`` reason is listed with it and not
simulated. Every other row is simulated as a ``plan:`` entry with ``disagg:`` (docs/simulate.md,
"Disaggregated targets") on the row's GPU, backend and precision, each pool with the row's workers,
tp, attention data parallel size (``dp``: each worker tp x dp GPUs, its scheduler limits per DP
rank, kvplan.sizing.gpus.data_parallel) and expert parallel size, the decode pool's ``max_num_seqs``
the row's decode batch per DP rank ("decode batch size x decode workers x attention DP = C",
../shared/SILICON_PROTOCOL.md), the
prefill pool's the engine's defaults (the row's prefill batch, 1 everywhere, is aiconfigurator's
static prefill batch, not a server flag), the KV moved over NVLink 5 on GB200/GB300 (one NVL72
domain) and over 400 Gb/s RDMA between the nodes of the other systems (kvplan/sizing/data/links.yaml;
the source does not name the fabric), the client's tokens all from the decode worker
(``first_token: decode``: the rows were served through Dynamo's or SGLang's router, which stream
the decode server's answer). Its load is the benchmark that measured it:

- the InferenceX rows (``db-dump/`` sources: ../shared/SILICON_PROTOCOL.md, "The InferenceX
  protocol (disaggregated, several nodes)", github NVIDIA/srt-slurm at e5c24f8b,
  ``src/srtctl/benchmarks/scripts/sa-bench/bench.sh``): lengths in [0.8 L, L], a closed loop at C
  whose first wave arrives together, C x 10 measured requests after a warm-up of C x 2 (measured
  before 2026-01-21: 5 and 5; 2026-01-21 and 22: 2 and 8). The warm-up there is a separate run at
  250 requests/s; here it is the same closed loop, drained before the measured requests start;
- the other rows (a pipeline whose protocol is not public): fixed lengths, a wave of C warm-up
  requests, two measured, as bench/silicon_check.py replays its "internal" rows.

kvplan's mean TTFT and TPOT are compared with the measured ones (error % = predicted / measured - 1).
The peer, in the same run: aiconfigurator's own disaggregated estimate (``cli_estimate(...,
mode="disagg")`` with the row's pools) from its own venv (``--peer-python``; made in a temporary
folder with ``pip install aiconfigurator==0.12.0`` when not given; ``--no-peer`` skips it).

    flock /tmp/kvplan-cpu.lock .venv/bin/python bench/silicon_disagg_check.py [--limit N] [--jobs 2] \
        [--dp-only | --no-dp] [--save rows.jsonl] [--row-seconds S]

``--row-seconds S`` gives up on a row after S seconds of simulation (listed with that reason: the
largest closed loops, C x 10 requests of up to 8,192 output tokens at C up to 8,192, take far
longer on this 2-CPU machine); ``--dp-only`` checks the rows that use attention data parallelism
in either pool, ``--no-dp`` the others; ``--save`` writes each row's results (kvplan's and the
peer's) as a JSON line as it finishes, and ``--report`` prints the table and medians of such a
file (a run cut short included) without simulating.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.silicon_check import err, measured_on, peer_python  # noqa: E402

ROWS_FILE = Path(__file__).resolve().parents[1] / "tests" / "kvplan" / "data" / "silicon_disagg.yaml"
NVL72 = {"gb200", "gb300"}
WEIGHTS = {"fp8": "fp8", "fp4": "nvfp4", "bf16": "auto", "int4": "int4"}


def load_rows() -> list[dict]:
    from kvplan.yaml_input import load_data

    return load_data(ROWS_FILE.read_text())["rows"]


def protocol(row: dict) -> tuple[dict[str, Any] | None, str]:
    """The row's benchmark (a bucket ``protocol:``, or None for fixed lengths and steady state)
    and its words."""
    if not row["source"].startswith("db-dump/"):
        return None, "steady state (protocol not public)"
    day = measured_on(row)
    warm, main = (2, 10)
    if day is not None and day < date(2026, 1, 21):
        warm, main = 5, 5
    elif day is not None and day < date(2026, 1, 23):
        warm, main = 2, 8
    kind = {
        "kind": "inferencex",
        "random_range_ratio": 0.8,
        "num_prompts_per_concurrency": main,
        "warmup_per_concurrency": warm,
    }
    return kind, f"inferencex {main}xC, warm-up {warm}xC"


def row_workload(row: dict):
    """The row as a workload whose one plan entry is its disaggregated deployment."""
    from kvplan.workload.file import parse_workload

    c, isl, osl = row["concurrency"], row["isl"], row["osl"]
    kind, _ = protocol(row)
    bucket: dict[str, Any] = {"name": "row", "input_tokens": isl, "output_tokens": osl, "concurrency": [c]}
    if kind is not None:
        bucket["protocol"] = kind
    else:
        bucket.update(num_requests=3 * c, warmup=c)
    pre, dec = row["prefill"], row["decode"]

    def pool(p: dict, seqs: int | None) -> dict[str, Any]:
        out = {"workers": p["workers"], "tp": p["tp"], "ep": max(p["moe_ep"], 1), "dp": max(p["attention_dp"], 1)}
        return out | ({"max_num_seqs": seqs} if seqs else {})

    data = {
        "name": "silicon-disagg-row",
        "engine": {
            "model": "tiny-random-llama",
            "max_num_seqs": max(1024, c),
            "max_num_batched_tokens": 8192,
            "max_model_len": isl + osl + 16,
        },
        "dataset": {"kind": "random"},
        "buckets": [bucket],
        "plan": [
            {
                "model": row["preset"],
                "gpu": row["gpu"],
                "tp": dec["tp"],
                "weight_dtype": WEIGHTS.get(row["precision"], "auto"),
                "backend": row["backend"],
                "disagg": {
                    "prefill": pool(pre, None),
                    "decode": pool(dec, dec["batch"]),
                    "link": "nvlink5" if row["system"] in NVL72 else "rdma-400g",
                    "first_token": "decode",
                },
            }
        ],
    }
    return parse_workload(data)


def simulate_row(row: dict, budget_s: int = 0) -> dict:
    """kvplan's mean TTFT and TPOT (ms) of one row, or the reason it could not simulate (one: it
    ran past ``budget_s`` seconds, where given)."""
    import signal

    from kvplan.errors import KvplanError

    def over(*_: Any) -> None:
        raise TimeoutError(f"not replayed within the bench's {budget_s} s per row")

    if budget_s:
        signal.signal(signal.SIGALRM, over)
        signal.alarm(budget_s)
    from kvplan.run.sim.gpu_target import disagg_setup
    from kvplan.run.sim.run import sample
    from kvplan.run.sim.search import Prober

    started = time.perf_counter()
    out: dict[str, Any] = {"id": row["id"]}
    try:
        workload = row_workload(row)
        setup = disagg_setup(workload, workload.plan[0], "plan[0]")
        bucket = workload.buckets[0]
        c = bucket.concurrency[0]
        prober = Prober(workload, setup.facts, setup.clock, sample(workload, setup.facts).requests, setup.make_backend)
        level = prober.level(0, "closed", c, plan=bucket.level_plan.at(c))
        if level is None or not level.ttft_ms or not level.tpot_ms:
            out["reason"] = "no finished requests"
        else:
            out.update(ttft_ms=level.ttft_ms.mean, tpot_ms=level.tpot_ms.mean, shape=setup.disagg)
    except KvplanError as e:
        out["reason"] = f"{e.field}: {e.problem}"
    except TimeoutError as e:
        out["reason"] = str(e)
    except Exception as e:  # a bench prints every row, with its reason
        out["reason"] = f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
    out["seconds"] = time.perf_counter() - started
    return out


PEER_SCRIPT = r"""
import json, logging, sys
logging.disable(logging.WARNING)
from aiconfigurator.cli.api import cli_estimate
for line in sys.stdin:
    job = json.loads(line)
    try:
        args = {k: v for k, v in job.items() if k not in ("id", "model_path", "system")}
        r = cli_estimate(job["model_path"], job["system"], mode=sys.argv[1], **args)
        print(json.dumps({"id": job["id"], "ttft_ms": r.ttft, "tpot_ms": r.tpot}), flush=True)
    except BaseException as e:
        print(json.dumps({"id": job["id"], "reason": f"{type(e).__name__}: {str(e)[:200]}"}), flush=True)
"""


def peer_rows(rows: list[dict], python: str) -> dict[str, dict]:
    """aiconfigurator's disaggregated estimate of every row, by id (the row's pools and quant modes)."""
    jobs = []
    for row in rows:
        job: dict[str, Any] = {
            "id": row["id"],
            "model_path": row["model_path"],
            "system": row["system"],
            "backend_name": row["backend"],
            "isl": row["isl"],
            "osl": row["osl"],
            "gemm_quant_mode": row["gemm_quant_mode"],
            "moe_quant_mode": row["moe_quant_mode"],
        }
        for role in ("prefill", "decode"):
            p = row[role]
            job |= {
                f"{role}_tp_size": p["tp"],
                f"{role}_attention_dp_size": max(p["attention_dp"], 1),
                f"{role}_moe_tp_size": p["moe_tp"] or None,
                f"{role}_moe_ep_size": p["moe_ep"] or None,
                f"{role}_batch_size": p["batch"],
                f"{role}_num_workers": p["workers"],
            }
        jobs.append(job)
    return estimates(jobs, python, "disagg")


def estimates(jobs: list[dict[str, Any]], python: str, mode: str) -> dict[str, dict]:
    """aiconfigurator's ``cli_estimate(model_path, system, mode=mode, **the job's other keys)`` of
    every job, run in ``python`` (its venv), by job id: ``ttft_ms`` and ``tpot_ms`` (ms), or the
    ``reason`` it gave none (a job it printed no line for: its stderr's last line, or exit code)."""
    done = subprocess.run(
        [python, "-c", PEER_SCRIPT, mode],
        input="\n".join(json.dumps(j) for j in jobs),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    got = {item["id"]: item for item in map(json.loads, filter(lambda s: s.startswith("{"), done.stdout.splitlines()))}
    said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:160]
    return {j["id"]: got.get(j["id"], {"id": j["id"], "reason": f"no line from the peer ({said})"}) for j in jobs}


def uses_dp(row: dict) -> bool:
    """Whether either pool of ``row`` runs attention data parallel."""
    return max(row["prefill"]["attention_dp"], row["decode"]["attention_dp"]) > 1


def median_abs(values: list[float | None]) -> float | None:
    kept = [abs(v) for v in values if v is not None]
    return statistics.median(kept) if kept else None


def report(rows: list[dict], ours: dict[str, dict], peer: dict[str, dict] | None) -> None:
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:+.1f}"

    cols = ("TTFT meas", "kvplan", "peer", "TPOT meas", "kvplan", "peer")
    print(f"{'row':60s} {'replay':42s} " + " ".join(f"{c:>{10 if 'meas' in c else 8}s}" for c in cols))
    for row in rows:
        o, p = ours.get(row["id"], {}), (peer or {}).get(row["id"], {})
        said = row["replay"] or o.get("reason") or protocol(row)[1]
        ttft, tpot = row["silicon_ttft_ms"], row["silicon_tpot_ms"]
        cells = [f"{ttft:10.1f}", *(f"{fmt(err(x.get('ttft_ms'), ttft)):>8s}" for x in (o, p))]
        cells += [f"{tpot:10.2f}", *(f"{fmt(err(x.get('tpot_ms'), tpot)):>8s}" for x in (o, p))]
        print(f"{row['id'][:60]:60s} {said[:42]:42s} " + " ".join(cells))
    ran = [r for r in rows if "ttft_ms" in ours.get(r["id"], {})]
    both = [r for r in ran if "ttft_ms" in (peer or {}).get(r["id"], {})]
    print(
        f"\nrows {len(rows)}: replayed {len(ran)}, not replayable {sum(bool(r['replay']) for r in rows)},"
        f" failed {len(rows) - len(ran) - sum(bool(r['replay']) for r in rows)}"
    )
    groups = [("replayed", ran), ("replayed, peer too", both)]
    groups += [
        (f"{name}, {kind}", [r for r in subset if uses_dp(r) == dp])
        for name, subset in groups[:]
        for kind, dp in (("dp", True), ("no dp", False))
    ]
    for name, subset in groups:
        if not subset:
            continue
        line = [f"{name:20s} {len(subset):4d} rows  median |error| %:"]
        for who, src in (("kvplan", ours), ("peer", peer or {})):
            t = median_abs([err(src.get(r["id"], {}).get("ttft_ms"), r["silicon_ttft_ms"]) for r in subset])
            p = median_abs([err(src.get(r["id"], {}).get("tpot_ms"), r["silicon_tpot_ms"]) for r in subset])
            line.append(f"{who} TTFT {fmt(t)} TPOT {fmt(p)}")
        print("  ".join(line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="check this many replayable rows, spread over the file")
    parser.add_argument("--peer-python", help="python of a venv with aiconfigurator==0.12.0")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    dp = parser.add_mutually_exclusive_group()
    dp.add_argument("--dp-only", action="store_true", help="the rows with attention data parallelism only")
    dp.add_argument("--no-dp", action="store_true", help="the rows without attention data parallelism only")
    parser.add_argument("--save", type=Path, help="write each row's results here as a JSON line as it finishes")
    parser.add_argument("--report", type=Path, help="print the report of a --save file; simulate nothing")
    parser.add_argument("--row-seconds", type=int, default=0, help="give up on a row after this many seconds")
    args = parser.parse_args()
    rows = load_rows()
    if args.dp_only:
        rows = [r for r in rows if uses_dp(r)]
    if args.no_dp:
        rows = [r for r in rows if not uses_dp(r)]
    if args.report:
        saved = [json.loads(line) for line in args.report.read_text().splitlines() if line.strip()]
        ours = {o["id"]: o for o in saved if o.get("who") == "kvplan"}
        peer = {o["id"]: o for o in saved if o.get("who") == "peer"}
        report([r for r in rows if r["id"] in ours or r["replay"]], ours, peer or None)
        return
    todo = [r for r in rows if not r["replay"]]
    if args.limit and args.limit < len(todo):
        todo = todo[:: max(len(todo) // args.limit, 1)][: args.limit]
        rows = todo
    print(f"{date.today()} on {platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()})")
    save = args.save.open("a") if args.save else None
    peer = None
    if not args.no_peer:
        started = time.perf_counter()
        peer = peer_rows(rows, peer_python(args.peer_python))
        print(f"peer (aiconfigurator 0.12.0 cli_estimate mode=disagg): {time.perf_counter() - started:.0f} s")
        for item in peer.values() if save else ():
            save.write(json.dumps({"who": "peer", **item}) + "\n")
    started = time.perf_counter()
    ours = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        for o in pool.map(simulate_row, todo, [args.row_seconds] * len(todo)):
            ours[o["id"]] = o
            if save:
                save.write(json.dumps({"who": "kvplan", **o}) + "\n")
                save.flush()
    ours_s = time.perf_counter() - started
    print(f"kvplan: {len(todo)} simulations in {ours_s:.0f} s\n")
    report(rows, ours, peer)


if __name__ == "__main__":
    main()
