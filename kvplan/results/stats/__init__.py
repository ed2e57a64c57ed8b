"""Statistics of a run's records, one concern a module: latency (TTFT, TPOT, ITL, E2E percentiles, as
vLLM's benchmark docs define them), classes (per request class), steady (the steady-state window
and LevelSchedule), arrival_stats, interference, prefix_metrics (prefix cache hits), shed
(admission), turns (sessions), variants and server_samples (a target's /metrics samples).
Pure functions of records: no torch."""
