"""Answers built on the simulator: ``kvplan plan`` (the cheapest deployment within the SLO) and ``kvplan advise``.

plan (the grid of deployments, each judged by simulation with kvplan.run.sim) -> plan_pool (the
grid run here, on a process pool or on Ray) -> plan_run (plan_deployments: the whole command as
one library call, writing plan.json, kvplan.results.plan_result, and its views,
kvplan.results.report.plan); advise (which optimisation pays: each one simulated against the
workload as given) -> advise_view.
"""
