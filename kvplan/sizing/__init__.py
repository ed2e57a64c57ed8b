"""KV sizing: model configs -> per-layer cache specs -> bytes per token, block and request -> capacity on a GPU.

Pure arithmetic on configs: no torch, no engine, nothing of kvplan above it.

    models/ (a config -> ModelSpec, one LayerSpec per layer, weights) -> kv_math (per-rank layer
      specs; dtypes names the KV dtypes) -> capacity (gpus/: the GPU table, speeds, prices, step
      costs; budget -> blocks, tokens, max concurrency) -> estimate (+ estimate_view, estimate_plot);
      llamacpp (llama.cpp's own KV buffers, + llamacpp_view). Data in data/.
"""
