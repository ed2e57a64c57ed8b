"""What to run and how to drive it: the workload schema, prompts, the level driver and its backends.

workload (schema) + workload_file (YAML -> Workload) -> prompts, prefixes (SampledRequests)
-> driver (closed/open-loop levels over a Backend) -> backends/engine (the bundled engine)
-> run_estimate (kvplan's prediction, KV per step) -> loadtest (the stages of a run).
"""
