"""A small paged-KV LLM engine: block manager, continuous-batching scheduler, Llama-family runner.

The engine never imports kvplan; kvplan reads the engine's real tensor bytes as its oracle.
"""
