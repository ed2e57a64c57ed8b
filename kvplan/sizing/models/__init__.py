"""A model's architecture from its config: model_source (preset | config.json | params.json | GGUF)
-> ModelSpec (model_spec; gguf_spec, meta_params and kv_keys map each format's keys, gguf_reader
reads a GGUF header, config_reader checks every value) with one LayerSpec per layer (layer_spec,
state_shapes: full, sliding, MLA, linear attention, Mamba, conv state) and the weights' bytes
(weights). Pure arithmetic on configs: no torch, no engine."""
