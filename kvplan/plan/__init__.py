"""The planner: model configs -> per-layer cache specs -> bytes per token, block and request ->
capacity on a GPU. Pure arithmetic on configs: no torch, no engine, nothing of load, results or gate.

    model_source (preset | config.json | params.json | GGUF) -> ModelSpec (model_spec; gguf_spec, meta_params
      map their keys; config_reader checks every value) with one LayerSpec per layer (layer_spec, state_shapes)
      -> kv_math (per-rank layer specs, dtypes) -> capacity (gpus, weights, budget) -> estimate (+ view, plot)
"""
