"""Prefill/decode disaggregation of the bundled engine (issue 36; semantics in docs/architecture.md#disagg).

A deployment is x prefill workers and y decode workers, each an ordinary ``LLMEngine``::

    request i --> prefill worker i mod x: the prompt's KV, token 1 (max_tokens = 1), blocks HELD
              --> handoff FIFO of decode worker i mod y: admitted at the start of a decode step
                  while running + in transfer < max_num_seqs and the pool has prompt_len + 1 tokens
                  of blocks --> transfer (ceil(prompt_len / block_size) blocks) --> prefill frees
                  its blocks --> joins the decode running set at the next step, num_computed_tokens
                  = prompt_len, token 1 its next input

kv_blocks: a request's blocks out of one KVCache and into another (bytes). scheduler: the
scheduler of a worker (holding a finished prefill's blocks; joining a transferred request).
workers: PrefillWorker and DecodeWorker around an LLMEngine. inproc: DisaggEngine, x + y workers
stepped by one loop in one process (the test vehicle and the reference of the served deployment).
"""
