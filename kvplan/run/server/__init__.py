"""A remote OpenAI-compatible server as the thing under load (``kvplan loadtest --target``).

The workload's ``target:`` section (kvplan.workload.server) -> preflight (/v1/models, /metrics,
what the server is) -> tokenizer (the server's model's tokenizer) -> estimate (kvplan's
prediction for the server's pool) -> backend (HttpBackend over client workers; sse parses their
streams; client_lag measures the client's own delay) + scraper (server_metrics read every
interval) -> run (the run folder through kvplan.run.lifecycle).
"""
