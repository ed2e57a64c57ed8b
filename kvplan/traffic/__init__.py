"""The requests a workload makes: sampled once per bucket, deterministic per seed, replayed at every level.

requests (SampledRequest, SampledBuckets) <- prompts (ShareGPT, random token ids, JSONL; bucket
sampling) with prefixes (shared system prompts or documents), mix (classes drawn by weight),
sessions (multi-turn conversations and their templated history) and trace (a trace's lines as
requests); tokenizer (the engine's tokenizer without torch) and samples (the sampled requests
cached on disk by what made them).
"""
