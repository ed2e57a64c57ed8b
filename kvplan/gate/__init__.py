"""``kvplan gate``: a finished run's result against a baseline file -> a verdict and an exit code.

values (what a run result says) -> baseline (the file CI keeps) -> gate (compare, notes) -> view
(console table, JUnit XML).
"""
