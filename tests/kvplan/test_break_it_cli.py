"""Bad input through the CLI, each case once found to misbehave (a traceback, a wrong exit code, a
loose line, or seconds of work before the refusal): fed to ``kvplan`` in process
(tests/kvplan/cli_runner.py), each must exit 2 with one line naming the field and the fix."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml

from kvplan.workload.file import load_workload
from tests.kvplan.cli_runner import run_cli

SMOKE = Path(__file__).parents[2] / "workloads" / "smoke.yaml"  # 48 blocks of 4 tokens


def _smoke(tmp_path: Path, name: str, drop: tuple[str, ...] = (), **bucket) -> Path:
    """workloads/smoke.yaml without its plan, its bucket's keys ``drop`` left out and ``bucket`` set."""
    data = yaml.safe_load(SMOKE.read_text())
    data.pop("plan")
    data["buckets"][0].update(bucket)
    for key in drop:
        del data["buckets"][0][key]
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("command", ["simulate", "loadtest"])
def test_an_aiperf_stddev_no_pool_holds_is_refused_before_its_prompts_are_drawn(tmp_path, command):
    # --isl-stddev 10^8 around 12 tokens: the normal is clipped at MAX_TOKENS = 2^24 = 16,777,216,
    # which 1,000 requests reach; once 1,000 prompts of up to 16 M random ids were drawn first
    # (4 of them took 6.6 s: 1,000 would take minutes and tens of GiB), now the lengths alone are
    # checked (60 s: loadtest builds the engine first, on a shared machine)
    path = _smoke(
        tmp_path,
        "aiperf.yaml",
        ("request_rates", "num_requests"),
        input_tokens=12,
        concurrency=[1],
        protocol={"kind": "aiperf", "input_stddev": 10**8, "request_count": 1000},
    )
    start = time.perf_counter()
    code, out, err = run_cli(command, str(path), "--out", str(tmp_path / "sim"), "--quiet")
    assert time.perf_counter() - start < 60 and code == 2 and not (tmp_path / "sim").exists(), err
    # ceil((16,777,216 + 12 - 1) / 4) = 4,194,307 blocks; 12 + 12 tokens alone would fit, so the stddev is named
    assert _one_line(err) == (
        f"error: {path}: buckets[0].protocol.input_stddev: the longest request (16777216 + 12 tokens) needs"
        " 4194307 blocks of 4 tokens, the KV pool has 48; lower it or grow engine.num_blocks"
    )


def test_a_mix_class_drawn_too_long_is_named_before_its_prompts_are_drawn(tmp_path):
    # class 'doc' of a mix: normal lengths of mean 5,000 and stddev 10^6 in [1, 10^7]; its longest
    # drawn prompt is named by the class before 10^7-token prompts are drawn
    path = _smoke(
        tmp_path,
        "mix.yaml",
        ("input_tokens", "output_tokens"),
        mix=[
            {"name": "chat", "weight": 1, "input_tokens": 12, "output_tokens": 4},
            {
                "name": "doc",
                "weight": 1,
                "input_tokens": {"min": 1, "max": 10**7, "dist": "normal", "mean": 5000, "std": 10**6},
                "output_tokens": 4,
            },
        ],
        num_requests=2000,
    )
    start = time.perf_counter()
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "sim"), "--quiet")
    line = _one_line(err)
    assert time.perf_counter() - start < 60 and code == 2 and not (tmp_path / "sim").exists(), err
    found = re.fullmatch(
        rf"error: {re.escape(str(path))}: buckets\[0\]\.mix\[1\]\.input_tokens: the longest request \((\d+) \+ 4"
        r" tokens\) needs (\d+) blocks of 4 tokens, the KV pool has 48; lower it or grow engine\.num_blocks",
        line,
    )
    assert found, line
    prompt, blocks = map(int, found.groups())
    assert 10**6 < prompt <= 10**7 and blocks == -(-(prompt + 4 - 1) // 4)  # 2,000 draws: some over 1 stddev


def test_an_unknown_link_lists_the_known_links_on_one_line(tmp_path):
    # once 'use one of: pcie5, pcie4, pcie5-x8' (difflib's matches at cutoff 0.4, as if those were
    # all there is; 'fast' got every name, 'rdma' three): now the closest, then every link
    names = ", ".join(
        yaml.safe_load((Path(__file__).parents[2] / "kvplan/sizing/data/links.yaml").read_text())["links"]
    )
    data = yaml.safe_load(SMOKE.read_text())
    data["engine"]["disagg"] = {"link": "pcie9"}
    path = tmp_path / "link.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "sim"), "--quiet")
    assert code == 2 and not (tmp_path / "sim").exists()
    assert _one_line(err) == (
        f"error: {path}: engine.disagg.link: unknown link 'pcie9' (closest: pcie5, pcie4, pcie5-x8);"
        f" use one of {names}; or give {{gbps: N, setup_us: N}}"
    )


def test_a_nan_in_a_gate_baseline_is_bad_input_not_a_regression(tmp_path):
    # once 'REGRESSION ttft_p99_ms [short c=1]: baseline nan, current 1.89 ms, limit nan', exit 1
    # (NaN compares false with every run); now the value is named, exit 2
    run, baseline = tmp_path / "run", tmp_path / "baseline.yaml"
    assert run_cli("simulate", str(SMOKE), "--out", str(run), "--quiet")[0] == 0
    assert run_cli("gate", str(run), "--baseline", str(baseline), "--update-baseline")[0] == 0
    assert run_cli("gate", str(run), "--baseline", str(baseline))[0] == 0  # the run against itself passes
    # a --junit under a file: once 'cannot write /dev/null/x.xml (File exists)', with no fix
    code, out, err = run_cli("gate", str(run), "--baseline", str(baseline), "--junit", "/dev/null/x.xml")
    assert code == 2 and err.strip().splitlines()[-1] == (
        "error: --junit: /dev/null is a file, so /dev/null/x.xml cannot be written; give a file path in a folder"
        " you can write, e.g. gate-junit.xml"
    )
    data = yaml.safe_load(baseline.read_text())
    data["values"]["short c=1"]["ttft_p99_ms"] = float("nan")
    baseline.write_text(yaml.safe_dump(data))
    code, out, err = run_cli("gate", str(run), "--baseline", str(baseline))
    assert code == 2 and _one_line(err) == (
        f"error: {baseline}: values.short c=1.ttft_p99_ms: is NaN, which no run can be compared with; give a"
        " number (null where the baseline run had none), or re-record the baseline with kvplan gate RUN_DIR"
        " --baseline FILE --update-baseline"
    )


def _with_disagg(tmp_path: Path, name: str, engine_workers: int | None, plan_workers: int | None) -> Path:
    data = yaml.safe_load(SMOKE.read_text())
    if engine_workers is not None:
        data["engine"]["disagg"] = {"prefill": {"workers": engine_workers}, "decode": {"workers": 1}}
    if plan_workers is not None:
        data["plan"][0]["disagg"] = {"prefill": {"workers": 1}, "decode": {"workers": plan_workers}}
    else:
        data.pop("plan")
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("engine_workers", "plan_workers", "line"),
    [
        # kvplan simulate of smoke.yaml: 1.3 s at 1 + 1 workers, 16 s at 64 + 64, none ended at 100,000
        (
            17,
            None,
            "engine.disagg.prefill.workers: 17 workers is over the 16 a pool of the bundled engine may hold (each"
            " loads its own weights and KV pool in this process); use at most 16",
        ),
        (
            None,
            100_000,
            "plan[0].disagg.decode.workers: 100000 workers is over the 64 a pool may hold (the simulator steps each"
            " one); use at most 64 and serve more load with replicas of the unit",
        ),
    ],
)
def test_a_pool_of_too_many_workers_is_refused(tmp_path, engine_workers, plan_workers, line):
    path = _with_disagg(tmp_path, "workers.yaml", engine_workers, plan_workers)
    start = time.perf_counter()
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "sim"), "--quiet")
    assert time.perf_counter() - start < 60 and code == 2 and not (tmp_path / "sim").exists()
    assert _one_line(err) == f"error: {path}: {line}"


def test_the_largest_pools_still_load(tmp_path):
    # 16 bundled workers a pool, 64 a plan entry's (the measured rows reach 40 prefill workers)
    assert load_workload(_with_disagg(tmp_path, "edge.yaml", 16, 64)).plan[0].disagg.decode.workers == 64


def test_plan_refuses_a_pool_of_too_many_workers(tmp_path):
    # once a pydantic ValidationError traceback from DisaggPool (exit 1) after the grid was built
    path = _smoke(tmp_path, "plan.yaml")
    code, out, err = run_cli(
        "plan", str(path), "--model", "llama-3.1-8b", "--gpus", "H100-SXM", "--tp", "1", "--rate", "1",
        "--disagg", "--prefill-workers", "1,65", "--max-gpus", "200", "--out", str(tmp_path / "plan"),
    )  # fmt: skip
    assert code == 2 and not (tmp_path / "plan").exists()
    assert _one_line(err) == (
        "error: --prefill-workers: 65 workers is over the 64 a pool may hold (the simulator steps each one);"
        " use at most 64 and serve more load with replicas of the unit"
    )


@pytest.mark.parametrize("value", ["two", "0", "1.5"])
def test_a_bad_search_jobs_variable_is_one_line_before_the_run_folder(tmp_path, monkeypatch, value):
    # 'two' was a ValueError traceback from int() after results.json and workload.yaml were written;
    # 0 and below quietly meant 1
    monkeypatch.setenv("KVPLAN_SEARCH_JOBS", value)
    path = _smoke(tmp_path, "w.yaml")  # no plan: entry, so no roofline warning line
    code, out, err = run_cli("simulate", str(path), "--out", str(tmp_path / "sim"), "--quiet")
    assert code == 2 and not (tmp_path / "sim").exists()
    assert (
        _one_line(err)
        == f"error: KVPLAN_SEARCH_JOBS: must be a whole number >= 1 (got {value!r}); unset it or give e.g. 1"
    )


def test_a_workload_path_that_is_no_workload_is_refused_without_reading_it_whole(tmp_path):
    # /dev/zero never ends: read whole, the process grew to 21 GB before the kernel killed it; a
    # 100 MiB file (a wrong path) was read whole before the YAML parser choked
    big = tmp_path / "big.yaml"
    with big.open("wb") as file:
        file.truncate(100 * 2**20)
    for path, line in [
        ("/dev/zero", "error: /dev/zero: is larger than the 64 MiB a workload file may be; check the path"),
        (str(big), f"error: {big}: is larger than the 64 MiB a workload file may be (100 MiB); check the path"),
    ]:
        code, out, err = run_cli("simulate", path, "--out", str(tmp_path / "sim"), "--quiet")
        assert code == 2 and _one_line(err) == line and not (tmp_path / "sim").exists()


def test_a_workload_from_a_pipe_still_loads():
    # <(envsubst < w.yaml) hands kvplan a pipe: read as a file is
    import os

    read, write = os.pipe()
    os.write(write, SMOKE.read_bytes())  # 1 KB: within the pipe's buffer
    os.close(write)
    try:
        assert load_workload(f"/dev/fd/{read}").name == "smoke"
    finally:
        os.close(read)


def test_a_prices_path_that_is_no_prices_file_is_refused_without_reading_it_whole(tmp_path):
    # --prices /dev/zero was read whole: a MemoryError traceback under a 2.5 GB limit, else the OOM killer
    path = _smoke(tmp_path, "w.yaml")
    code, out, err = run_cli(
        "plan", str(path), "--model", "llama-3.1-8b", "--gpus", "H100-SXM", "--rate", "1",
        "--prices", "/dev/zero", "--out", str(tmp_path / "plan"),
    )  # fmt: skip
    assert code == 2 and not (tmp_path / "plan").exists()
    assert _one_line(err) == "error: --prices: /dev/zero is larger than the 64 MiB a prices file may be; check the path"


def test_a_baseline_path_that_is_no_baseline_is_refused_without_reading_it_whole(tmp_path):
    # a 100 MiB file (a wrong path) was read whole before the YAML parser choked
    run, big = tmp_path / "run", tmp_path / "big.yaml"
    assert run_cli("simulate", str(_smoke(tmp_path, "w.yaml")), "--out", str(run), "--quiet")[0] == 0
    with big.open("wb") as file:
        file.truncate(100 * 2**20)
    code, out, err = run_cli("gate", str(run), "--baseline", str(big))
    assert code == 2 and _one_line(err) == (
        f"error: {big}: is larger than the 64 MiB a baseline may be (100 MiB); check the path"
    )


def test_a_log_without_line_breaks_is_refused_at_64_mib():
    # kvplan profile /dev/zero read one endless line: a MemoryError traceback under a 2.5 GB limit
    code, out, err = run_cli("profile", "/dev/zero")
    assert code == 2 and _one_line(err) == (
        "error: /dev/zero: line 1: is over 64 MiB without a line break, so not one request; check the path:"
        " give a JSONL file, one request a line"
    )


def test_an_estimate_grid_too_large_to_print_is_refused():
    # 20,000 contexts x 20,000 batches: over 60 s with no line printed (1,000 x 1,000 too)
    many = ",".join(str(n) for n in range(1, 20_001))
    code, out, err = run_cli("estimate", "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--batch", many)
    assert code == 2 and _one_line(err) == (
        "error: --batch: 20,000 values, over the 128 one table takes (every context x every batch); give at most"
        " 128, e.g. 1,8,32"
    )
    # 128 still runs
    code, out, err = run_cli(
        "estimate", "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--batch", many.rsplit(",", 20_000 - 128)[0]
    )
    assert code == 0, err
