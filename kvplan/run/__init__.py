"""The stages of a run and one folder per kind of run: what drives the requests a workload makes.

Shared stages: checks (every sampled request fits the engine that was built) -> driver
(closed- and open-loop levels over any Backend, every record written as it happens; session_loop
for the users of multi-turn sessions) -> estimate (kvplan's prediction for the run, KV per step)
-> lifecycle (the run folder: start, levels, finish) with progress on the console.

Kinds of run, which import none of each other (tests/test_layout.py):

- bundled/: the in-process engine as a backend, and the fp8 KV quality check;
- server/: a remote OpenAI-compatible server (``--target``: pre-flight, client, SSE parsing,
  /metrics scraping, tokenizer, estimate, run);
- sim/: the engine's scheduler on a cost-model clock (backend, cost models, calibration/,
  search, run).

loadtest is the bundled engine's run, the one place two kinds meet: it sets each bucket's knee,
simulated on the engine's own scheduler, beside the measured one.
"""
