"""GPU test set-up: every test here needs CUDA and the built extension.

`ext` builds/loads `nwor_lab.ops._ext` once per session; a build failure fails the tests (it is
never a skip on a GPU machine). NWOR_LAB_SANITIZE=1 shrinks the case matrix for runs under
compute-sanitizer, which is slow.
"""
import os

import pytest
import torch

SANITIZE = os.environ.get("NWOR_LAB_SANITIZE", "") == "1"


@pytest.fixture(scope="session")
def ext():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from nwor_lab.ops import _ext

    _ext.load()
    return torch.ops.nwor_lab


@pytest.fixture(scope="module")
def toy_pair16():
    """The shipped toy pair's shape with heads of 16 (what Triton's tl.dot takes), on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from nwor_lab.model.toy import toy_config, toy_pair
    target, head = toy_pair(0, cfg=toy_config(hidden_size=64))
    return target.to("cuda"), head.to("cuda")


@pytest.fixture(scope="module")
def hybrid_pair16():
    """The hybrid toy pair (`bench.state.toy_pair`: recurrent layers beside attention) with heads of 16
    (what Triton's attention takes), on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from nwor_lab.bench.state import toy_pair
    target, head = toy_pair(wide=True)
    return target.cuda(), head.cuda()
