"""``kvplan plan --host-offload-gib``: host memory as a dimension of a replica. On a workload whose
64 long shared prefixes outgrow an L4's KV pool (Llama-3.1-8B), each configuration with and
without a 64 GiB host tier equals ``kvplan simulate`` of the same workload with and without
``engine.offload.host_gib`` run apart; the verdict's GPUs are the replicas' arithmetic; bad sizes
are one line, exit 2."""

import json
import math
from pathlib import Path

import pytest

from tests.kvplan.cli_runner import run_cli
from tests.kvplan.scratch import scratch

WORKLOAD = """name: prefixes
seed: 0
engine:
  model: SmolLM2-135M-Instruct
  block_size: 16
  max_num_seqs: 256                 # kvplan plan's default grid values: simulate runs the same limits
  max_num_batched_tokens: 8192
  enable_prefix_caching: {caching}
{offload}dataset: random
shared_prefix: {{num_tokens: 2048, num_prefixes: 64, fraction: 1.0}}
slo: {{ttft_ms: 1000, tpot_ms: 100}}
buckets:
  - name: docs
    input_tokens: [16, 32]
    output_tokens: [16, 32]
    concurrency: [4]
    num_requests: 300
plan: [{{model: llama-3.1-8b, gpu: L4, tp: 1}}]
"""
ARGS = ("--model", "llama-3.1-8b", "--gpus", "L4", "--tp", "1", "--jobs", "2")


def workload(host_gib: float = 0, caching: bool = True) -> Path:
    path = scratch("kvplan-offload-") / "w.yaml"
    offload = f"  offload: {{host_gib: {host_gib}}}\n" if host_gib else ""
    text = WORKLOAD.format(offload=offload, caching=str(caching).lower())
    if not caching:  # shared_prefix needs prefix caching: plain prompts
        text = "\n".join(line for line in text.splitlines() if not line.startswith("shared_prefix"))
    path.write_text(text)
    return path


def plan_json(path: Path, *args: str) -> dict:
    code, out, err = run_cli("plan", str(path), *ARGS, *args, "--json", "--out", str(path.parent / "plan"))
    assert code == 0, err
    return json.loads(out)


def by_host(planned: dict) -> dict:
    return {c["host_offload_gib"]: c for c in planned["configs"]}


def simulated(path: Path) -> dict:
    """The plan[0] target's capacities in ``kvplan simulate`` of ``path``."""
    code, out, err = run_cli("simulate", str(path), "--json", "--out", str(path.parent / "sim"))
    assert code == 0, err
    (target,) = [t for t in json.loads(out)["targets"] if t["target"] == "plan[0]"]
    (bucket,) = target["buckets"]
    return {k: bucket[k]["level"] for k in ("max_concurrency", "max_request_rate")}


def test_each_host_tier_size_equals_kvplan_simulate_of_the_engine_section_with_it():
    planned = by_host(plan_json(workload(), "--host-offload-gib", "0,64", "--users", "8"))
    assert set(planned) == {None, 64.0}
    for host_gib, config in planned.items():
        apart = simulated(workload(host_gib or 0))
        assert (config["slo_max_concurrency"], config["slo_max_request_rate"]) == (
            apart["max_concurrency"],
            apart["max_request_rate"],
        )
    # the tier serves prefixes the device pool let go: more requests/s within the TTFT SLO
    assert planned[64.0]["slo_max_request_rate"] > 2 * planned[None]["slo_max_request_rate"]


def test_the_verdict_says_a_host_tier_pays_and_by_how_many_gpus():
    path = workload()
    planned = plan_json(path, "--host-offload-gib", "0,64", "--rate", "4")
    tiered, plain = by_host(planned)[64.0], by_host(planned)[None]
    for c in (tiered, plain):
        assert c["replicas"] == math.ceil(4 / c["slo_max_request_rate"] - 1e-9) and c["num_gpus"] == c["replicas"]
    assert planned["best"] == tiered and tiered["num_gpus"] < plain["num_gpus"]
    verdict = planned["offload_verdict"]
    assert verdict.startswith(f"host offload pays: L4 x1 + 64 GiB host tier x{tiered['replicas']} (")
    assert verdict.endswith(f": {plain['num_gpus'] - tiered['num_gpus']} GPU(s) fewer")
    summary = (path.parent / "plan" / "summary.md").read_text()
    assert f"## Host offload\n\n{verdict}\n" in summary
    assert "--kv-offloading-backend native --kv-offloading-size 64" in summary  # the best's vllm serve line


@pytest.mark.parametrize(
    ("args", "caching", "line"),
    [
        (("--host-offload-gib", "0,-1"), True, "--host-offload-gib: must be GiB >= 0 (got 0,-1)"),
        (("--host-offload-gib", "lots"), True, "--host-offload-gib: must be comma-separated numbers (got 'lots')"),
        (("--host-offload-gib", "64"), False, "--host-offload-gib: a host KV tier keeps prefix-cache blocks"),
    ],
)
def test_bad_host_tier_sizes_are_one_line_and_exit_2(args, caching, line):
    path = workload(caching=caching)
    code, out, err = run_cli("plan", str(path), *ARGS, "--rate", "1", *args)
    assert code == 2 and line in err and len(err.strip().splitlines()) == 1, err
