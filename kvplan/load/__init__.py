"""What to run and how to drive it: the stages every run shares, and one folder per kind of run.

Shared stages: workload + buckets (schema) + workload_file (YAML -> Workload) -> prompts, prefixes
(SampledRequests) -> checks (every request fits) -> driver (closed/open-loop levels over a
Backend) -> run_estimate (kvplan's prediction, KV per step) -> lifecycle (the run folder: start,
levels, finish).

Kinds of run, which import none of each other (tests/test_layout.py):

- bundled/: the in-process engine as a backend, and the fp8 KV quality check;
- target/: a remote OpenAI-compatible server (settings, pre-flight, client, SSE parsing,
  /metrics scraping, tokenizer, estimate, run);
- sim/: the engine's scheduler on a cost-model clock (backend, cost models, search, run).

loadtest is the bundled engine's run, the one place two kinds meet: it sets each bucket's knee,
simulated on the engine's own scheduler, beside the measured one.
"""
