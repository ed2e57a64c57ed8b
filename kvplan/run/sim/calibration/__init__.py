"""Step-time calibrations: a cost model fitted on a measured run, the ones kvplan ships, and their drift.

fit (least squares on a run's step records) -> store (CalibrationFile: save, load, the shipped
files in data/, found by engine and machine) -> drift (a calibration against a new measured run)
-> view (the calibration on the console).
"""
