"""A simulation's report from the records it kept in memory (kvplan.results.store.KeptRecords) is
the report from its JSONL files read back, and steps.csv built column by column is the frame
built row by row (kvplan.results.csv_tables.step_frame against step_row)."""

from pathlib import Path

import pandas as pd

from kvplan.results.csv_tables import step_frame, step_row
from kvplan.results.run_result import load_run, read_result
from kvplan.results.store import KeptRecords
from kvplan.results.summarize import summarize
from kvplan.results.writing.run_writer import RunWriter
from kvplan.run.sim.run import simulate
from kvplan.run.sim.setups import engine_setup
from kvplan.workload.file import load_workload

CHAT = Path(__file__).resolve().parents[3] / "workloads" / "chat.yaml"


def test_kept_records_give_the_report_of_the_files(tmp_path):
    workload = load_workload(CHAT)
    run_dir = simulate(workload, engine_setup(workload)[0], tmp_path / "sim", search=False)
    saved = read_result(run_dir)  # summarized from the records simulate kept in memory
    data = load_run(run_dir)  # the records read back from requests.jsonl and steps.jsonl
    again = summarize(saved, data.requests, data.steps, data.server_samples)
    assert again.levels == saved.levels and len(saved.levels) >= 2
    assert sum(lv.num_completed for lv in saved.levels) == len(data.requests) > 0
    frame = step_frame(data.steps)
    assert frame.equals(pd.DataFrame([step_row(s) for s in data.steps]))
    assert list(frame.columns) == list(step_row(data.steps[0]))


def test_a_writer_keeps_what_it_writes(tmp_path):
    workload = load_workload(CHAT)
    first = simulate(workload, engine_setup(workload)[0], tmp_path / "a", search=False)
    data = load_run(first)
    kept = KeptRecords()
    with RunWriter(tmp_path / "b", flush=False, kept=kept) as writer:
        for r in data.requests:
            writer.write_request(r)
        for s in data.steps:
            writer.write_step(s)
    assert kept.requests == data.requests and kept.steps == data.steps
    assert (tmp_path / "b" / "steps.jsonl").read_bytes() == (first / "steps.jsonl").read_bytes()
