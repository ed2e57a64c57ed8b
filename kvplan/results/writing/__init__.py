"""Writing a run's records as they come: the JSONL files appended record by record, or, for a
simulation that keeps its records in memory, made a chunk at a time by forked processes
(``run_writer``)."""
