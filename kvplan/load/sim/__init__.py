"""``kvplan simulate``: the engine's own scheduler (kvplan.load.sim.backend) on a cost-model clock.

backend (SimBackend: the scheduler stepped on a clock), cost (what a step costs; clocks), fit +
calibrations + drift (a step-time model fitted on a measured run; shipped ones in data/), replay (a
measured run's own step times), gpu_target (a GPU's roofline, kvplan.plan.step_cost), facts +
tokenizer + samples (the engine's pool and prompts without torch), search (knee, SLO capacity,
``concurrency: auto``), run (the run folder), setups and cli_setup (what the CLI's options mean),
views (the calibration on the console).
"""
