"""The planner: model configs -> per-layer KV specs -> bytes per token, block and request ->
capacity on a GPU. Pure arithmetic on configs: no torch, no engine, nothing of load, results or gate.

    model_source (preset | config.json | GGUF) -> ModelSpec (model_spec, gguf_spec)
      -> kv_math (per-layer KV specs, dtypes) -> capacity (gpus, weights, budget) -> estimate (+ view, plot)
"""
