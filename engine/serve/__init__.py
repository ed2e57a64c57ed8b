"""``python -m engine.serve``: the bundled engine behind an OpenAI-compatible HTTP API.

app (flags, FastAPI routes, start-up) -> api (request bodies -> Jobs, response chunks) ->
loop (one engine loop stepping for every stream) -> metrics (/metrics with vLLM's metric names).
"""
