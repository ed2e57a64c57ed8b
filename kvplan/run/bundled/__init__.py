"""The bundled engine in this process: backend (the engine as a driver Backend, its facts and
tokenizer) and fp8_quality (fp8 KV scales from a run's prompts, and the quality check against
the model dtype's cache)."""
