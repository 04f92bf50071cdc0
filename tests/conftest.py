"""Shared test set-up: GPU tests are skipped where CUDA is absent (CI, laptops)."""
import os

import pytest
import torch

# Hypothesis: deterministic in CI, bounded time per example.
try:
    from hypothesis import settings
    settings.register_profile("ci", derandomize=True, deadline=None, max_examples=40)
    settings.register_profile("dev", deadline=None, max_examples=25)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")
except ImportError:  # pragma: no cover
    pass


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
