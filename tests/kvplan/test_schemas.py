"""`kvplan schema workload|results|plan`: valid JSON Schema (draft 2020-12) that kvplan's own files pass."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.kvplan.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = sorted((ROOT / "workloads").glob("*.yaml"))
FIXTURE = ROOT / "tests" / "kvplan" / "data" / "schema1"


def schema(which: str) -> dict:
    code, out, err = run_cli("schema", which)
    assert (code, err) == (0, "")
    printed = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(printed)  # raises on an invalid schema
    assert printed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    return printed


def test_an_unknown_schema_is_one_line():
    assert run_cli("schema", "baseline") == (
        2,
        "",
        "error: which: unknown schema 'baseline'; use one of workload, results, plan\n",
    )


@pytest.mark.parametrize("path", WORKLOADS, ids=[p.name for p in WORKLOADS])
def test_every_bundled_workload_validates(path):
    jsonschema.Draft202012Validator(schema("workload")).validate(yaml.safe_load(path.read_text()))


def test_the_workload_schema_accepts_the_shorthands_and_refuses_typos():
    validator = jsonschema.Draft202012Validator(schema("workload"))
    bucket = {"name": "b", "input_tokens": [16, 256], "output_tokens": 128, "concurrency": [1], "num_requests": 4}
    good = {
        "name": "w",
        "dataset": {"jsonl": "p.jsonl"},
        "buckets": [bucket],
        "plan": [{"model": "llama-3.1-8b", "gpu": "L4", "kv_dtype": "fp8"}],
    }  # the deprecated name too
    validator.validate(good)
    validator.validate({**good, "dataset": "sharegpt"})
    for bad in (
        {**good, "bukets": []},
        {**good, "buckets": [{**bucket, "input_tokens": [16]}]},
        {**good, "dataset": "imagenet"},
        {**good, "seed": -1},
    ):
        assert not validator.is_valid(bad), bad


def test_a_run_result_validates(tmp_path):
    from kvplan.results.run_result import read_result, save_result

    result = read_result(FIXTURE / "run")  # schema 1 on disk, migrated: saved again as schema 2
    save_result(tmp_path, result)
    written = json.loads((tmp_path / "results.json").read_text())
    jsonschema.Draft202012Validator(schema("results")).validate(written)
    assert written["schema_version"] == 2 and written["engine"]["pool_tokens"] == 32 * 4
    assert not jsonschema.Draft202012Validator(schema("results")).is_valid({**written, "status": "paused"})


def _undescribed(node, path: str) -> list[str]:
    """The paths of the properties under ``node`` (an object schema or one combining them) that have
    no description, nested objects, anyOf/allOf/oneOf branches and array items included."""
    if not isinstance(node, dict):
        return []
    missing = []
    for name, prop in node.get("properties", {}).items():
        if not str(prop.get("description", "")).strip():
            missing.append(f"{path}.{name}")
        missing += _undescribed(prop, f"{path}.{name}")
    for key in ("anyOf", "allOf", "oneOf", "prefixItems"):
        for i, branch in enumerate(node.get(key, [])):
            missing += _undescribed(branch, f"{path}.{key}[{i}]")
    for key in ("items", "additionalProperties"):
        missing += _undescribed(node.get(key), f"{path}.{key}")
    return missing


def test_every_workload_field_is_described():
    printed = schema("workload")
    defs = printed["$defs"]
    missing = _undescribed({k: v for k, v in printed.items() if k != "$defs"}, "workload")
    for name, definition in defs.items():
        missing += _undescribed(definition, name)
        assert str(definition.get("description", "")).strip(), f"{name} has no description"
    assert not missing, f"{len(missing)} workload fields have no description: {', '.join(missing)}"
    assert printed["description"].strip()
    # the walk does reach the nested sections and the shorthands
    assert {"EngineSettings", "Bucket", "Lengths", "Dataset", "TargetSettings", "Slo", "Tolerance"} <= set(defs)
    shorthand = next(b for b in defs["Dataset"]["anyOf"] if "jsonl" in b.get("properties", {}))
    assert "JSONL" in shorthand["properties"]["jsonl"]["description"]
    # units where they apply
    units = (
        ("Slo", "ttft_ms", "ms"),
        ("Slo", "tpot_ms", "ms"),
        ("Slo", "e2e_ms", "ms"),
        ("TargetSettings", "timeout_s", "s,"),
        ("TargetSettings", "scrape_interval_ms", "ms"),
        ("EngineSettings", "block_size", "tokens"),
        ("EngineSettings", "kv_cache_memory", "bytes"),
        ("EngineSettings", "max_num_batched_tokens", "tokens"),
        ("Bucket", "request_rates", "req/s"),
        ("SharedPrefix", "fraction", "0..1"),
    )
    for section, field, unit in units:
        description = defs[section]["properties"][field]["description"]
        assert unit in description, f"{section}.{field}: {description!r} does not say {unit!r}"
    assert "Old name of kv_cache_dtype" in defs["PlanTarget"]["properties"]["kv_dtype"]["description"]
