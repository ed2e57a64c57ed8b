"""The writing and summarising of a simulated run alone (docs/benchmarks.md#trace-20k): a run
folder's recorded steps and requests written again through ``RunWriter`` as a simulation writes
them (the scheduler's stats with the level's key and KV sizes, records kept in memory), then the
summaries (``summarize``) and steps.csv / requests.csv (``write_tables``) from the kept records.
Prints each part's seconds and whether the files written equal the run's own, byte for byte, and
the level summaries equal its results.json's. Times the kvplan it imports: put a tree first on
PYTHONPATH to time that tree (e.g. a ``git archive`` of main beside your worktree).

    PYTHONPATH=TREE .venv/bin/python bench/sim_records.py RUN_DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import kvplan
from kvplan.results.csv_tables import write_tables
from kvplan.results.records import RequestRecord, StepRecord
from kvplan.results.run_result import read_result
from kvplan.results.store import KeptRecords, read_jsonl
from kvplan.results.summarize import summarize
from kvplan.results.writing.run_writer import RunWriter

SIZES = ("ideal_bytes", "paged_bytes", "contiguous_bytes", "measured_bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a simulated run folder (one level, e.g. bench/sim_trace_20k.py --keep)")
    args = parser.parse_args()
    steps = read_jsonl(args.run / "steps.jsonl", StepRecord)
    requests = read_jsonl(args.run / "requests.jsonl", RequestRecord)
    result = read_result(args.run).model_copy(update={"levels": [], "buckets": [], "kv": None})
    out = Path(tempfile.mkdtemp(prefix="sim_records-"))
    try:
        start = time.perf_counter()
        kept = KeptRecords()
        with RunWriter(out, flush=False, kept=kept) as writer:
            fast = getattr(writer, "write_step_stats", None)  # the Recorder's path where the writer has it
            for s in steps:
                sizes = {k: getattr(s, k) for k in SIZES}
                if fast is not None:
                    fast(s.key, s, sizes)
                else:
                    writer.write_step(StepRecord.from_stats(s.key, s, **sizes))
            for r in requests:
                writer.write_request(r)
        written = time.perf_counter()
        summed = summarize(result, kept.requests, kept.steps)
        summarized = time.perf_counter()
        write_tables(out, kept.requests, kept.steps)
        done = time.perf_counter()
        files = ("steps.jsonl", "requests.jsonl", "steps.csv", "requests.csv")
        same = all((out / n).read_bytes() == (args.run / n).read_bytes() for n in files)
        levels = [lv.model_dump(mode="json") for lv in summed.levels]
        same_levels = levels == json.loads((args.run / "results.json").read_text())["levels"]
    finally:
        shutil.rmtree(out)
    print(f"kvplan from {Path(kvplan.__file__).parents[1]}: {len(steps):,} steps, {len(requests):,} requests")
    print(
        f"write {written - start:.2f} s, summarize {summarized - written:.2f} s, tables {done - summarized:.2f} s,"
        f" total {done - start:.2f} s; files equal to the run's: {same}; level summaries equal: {same_levels}"
    )


if __name__ == "__main__":
    main()
