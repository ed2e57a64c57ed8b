"""Shared test set-up.

TRITON_INTERPRET must be set before any module defining @triton.jit kernels is imported:
without a GPU, Triton runs only in its interpreter (../shared/ENVIRONMENT.md).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# ---- property tests (hypothesis): the same cases on every CI run, a deeper search on demand ----
# "ci" (the default): derandomised, so every run draws the same cases; no examples database, so
# nothing a run left on disk changes the next; the failing case printed with its reproduce blob.
# "fuzz" (`make fuzz`): random cases from --hypothesis-seed, each test's own max_examples times
# KVPLAN_FUZZ_FACTOR (default 20). A case it finds becomes an @example of its test.
# CONTRIBUTING.md, "Property tests", says how to use both.
import hypothesis  # noqa: E402
import pytest  # noqa: E402

hypothesis.settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
hypothesis.settings.register_profile("fuzz", derandomize=False, database=None, print_blob=True, deadline=None)
hypothesis.settings.load_profile(os.environ.get("KVPLAN_HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under the fuzz profile, scale each property test's own max_examples by KVPLAN_FUZZ_FACTOR."""
    if hypothesis.settings.default is not hypothesis.settings.get_profile("fuzz") and (
        config.getoption("hypothesis_profile", None) != "fuzz"
    ):
        return
    factor = int(os.environ.get("KVPLAN_FUZZ_FACTOR", "20"))
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)  # what @settings gave the test
        if own is not None and own.max_examples > 1:
            test._hypothesis_internal_use_settings = hypothesis.settings(own, max_examples=own.max_examples * factor)
