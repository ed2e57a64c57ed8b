"""Shared test set-up.

TRITON_INTERPRET must be set before any module defining @triton.jit kernels is imported:
without a GPU, Triton runs only in its interpreter (../shared/ENVIRONMENT.md).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
