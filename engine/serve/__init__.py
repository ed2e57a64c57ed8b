"""``python -m engine.serve``: the bundled engine behind an OpenAI-compatible HTTP API.

app (flags, FastAPI routes, start-up) -> api (request bodies -> Jobs, response chunks) ->
loop (one engine loop stepping for every stream) -> metrics (/metrics with vLLM's metric names).
Disaggregated (``--role prefill|decode``): role_app (the role servers' routes) -> role_loops (the
loops around engine.disagg's workers) -> disagg_metrics; router (``python -m engine.serve.router``,
the one endpoint in front of them).
"""
