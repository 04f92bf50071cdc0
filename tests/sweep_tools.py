"""What the sweep tests share: their workers and kernels import this checkout's nwor_lab."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from nwor_lab.sweep import METRICS_ENV

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def kernel_sees_this_checkout():
    """Workers and kernels inherit the environment: make them import this checkout's nwor_lab (and
    record nowhere a test did not ask for). Autouse in every module that imports it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        mp.delenv(METRICS_ENV, raising=False)
        yield
