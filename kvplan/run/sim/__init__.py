"""``kvplan simulate``: the engine's own scheduler (kvplan.run.sim.backend) on a cost-model clock.

backend (SimBackend: the scheduler stepped on a clock), cost (what a step costs; clocks),
the engine's decode runs (engine.decode_run: decode-only steps in one go), calibration/ (step-time models fitted on
measured runs), replay (a measured run's own step times), gpu_target (a GPU's roofline or
measured silicon, kvplan.sizing.gpus), facts (the engine's pool without torch), brackets +
search (knee, SLO capacity, ``concurrency: auto``), run (the run folder), setups and cli_setup
(what the CLI's options mean).
"""
