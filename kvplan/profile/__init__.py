"""``kvplan profile``: a request log or trace read, its traffic profile, and the workload that reproduces it.

log (OpenAI-style JSONL, Mooncake traces, kvplan's request logs -> LoggedRequest) -> stats (the
traffic profile: lengths, arrivals, sessions, prefix reuse) -> workload (the workload YAML that
resembles it) or replay (the trace that replays it); sharegpt (a profile filled from ShareGPT
prompts); view and plots (its tables and charts). Not a load: it imports no run.
"""
