"""GPUs: the table of GPUs and their memory (gpus), their speeds (gpu_perf: FLOP/s, bandwidth, fitted
efficiencies), public prices (prices), the roofline step time (step_cost) and measured-silicon
step times from aiconfigurator-core (silicon, silicon_db, silicon_models). Data in ../data/."""
