"""What a run leaves behind: raw records, the typed run result, metrics, and the report.

records (LevelKey, RequestRecord, StepRecord) -> store (the run folder on disk) -> metrics (pure)
-> summarize -> run_result (RunResult: save, load, migrate) -> report (tables, charts, summary.md).
Imports nothing of kvplan.run or kvplan.gate.
"""
