"""Answers built on the simulator: ``kvplan plan`` (the cheapest deployment within the SLO) and ``kvplan advise``.

plan (the grid of deployments, each simulated with kvplan.run.sim) -> plan_pool (the grid run in
a process pool or on Ray) -> plan_run (plan.json, the run folder of a plan) -> plan_view (its
tables); advise (which optimisation pays: each one simulated against the workload as given) ->
advise_view.
"""
