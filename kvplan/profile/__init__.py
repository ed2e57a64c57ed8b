"""``kvplan profile``: a request log or trace read, its traffic profile, and the workload that reproduces it.

stream (a log read once, as a stream: csv_traces tells its format, log reads its JSONL lines, table
keeps each request's row, blocks its distinct prefix blocks) -> stats (the traffic profile: lengths,
arrivals, load over time in load, sessions, prefix reuse) -> workload (the workload YAML that
resembles it) or replay (the trace that replays it, from the log read whole by parsed); sharegpt (a
profile filled from ShareGPT prompts); view and plots (its tables and charts). Not a load: it
imports no run.
"""
