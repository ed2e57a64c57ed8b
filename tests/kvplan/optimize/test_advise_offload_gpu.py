"""``kvplan advise --gpu``'s host offload alternative on a GPU target with prefix reuse (issue 37's
acceptance): 64 shared 2,048-token prefixes outgrow an L4's KV pool under Llama-3.1-8B; the host
tier's row equals ``kvplan simulate`` of the workload with that ``engine.offload.host_gib`` on the
same target, run apart, and the tier serves the prefixes the pool let go."""

import json
import re

import yaml

from kvplan.results.run_result import read_result
from tests.kvplan.cli_runner import run_cli
from tests.kvplan.optimize.test_plan_offload import workload

TARGET = ("--model", "llama-3.1-8b", "--gpu", "L4")


def test_the_host_offload_row_on_a_gpu_target_is_the_simulation_with_that_tier():
    path = workload()
    doc = yaml.safe_load(path.read_text())
    doc["buckets"][0].update(concurrency=[2], num_requests=120)  # lighter: one level, fewer requests
    doc["plan"] = []
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run_cli("advise", str(path), *TARGET, "--json")
    assert code == 0, err
    (row,) = [a for a in json.loads(out)["alternatives"] if a["name"].startswith("host offload ")]
    host_gib = float(re.fullmatch(r"host offload (\S+) GiB", row["name"]).group(1))
    doc["engine"]["offload"] = {"host_gib": host_gib}
    edited = path.parent / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc))
    code, _, err = run_cli("simulate", str(edited), *TARGET, "--out", str(path.parent / "run"), "--quiet")
    assert code == 0, err
    result = read_result(path.parent / "run")
    cap = result.capacity[0].buckets[0]
    mine = row["buckets"][0]
    assert mine["max_request_rate"] == cap.max_request_rate.level
    assert mine["max_users"] == cap.max_concurrency.level
    level = next(lv for lv in result.levels if lv.mode == "closed" and lv.level == 2)  # the bucket's level
    assert mine["ttft_p50_ms"] == level.ttft_ms.p50
    assert mine["offload"] == level.offload.model_dump()
    assert level.offload.num_host_loads > 0 and level.offload.num_host_hit_tokens > 0
    assert row["verdict"] == "worth it"  # loads over PCIe cost far less than 2,048-token prefills on an L4
