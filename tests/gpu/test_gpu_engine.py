"""The engine on the GPU (CUDA extension): every NWOR x SCV mode gives the target-only tokens,
with debug on (committed == accepted by the sampler, every window)."""
import pytest

from nwor_lab import LabConfig
from nwor_lab.engine import generate

pytestmark = pytest.mark.gpu

PROMPTS = ["def parse_args(argv):", "import os\nclass Config:", "for i in range(", "    return"]


@pytest.fixture(scope="module")
def reference():
    return generate(PROMPTS, max_new_tokens=32, k=0, config=LabConfig(backend="cuda"), device="cuda").token_ids


@pytest.mark.parametrize("scv", ["off", "graph", "adaptive"])
@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_gpu_speculative_equals_target_only(reference, mode, scv):
    cfg = LabConfig(nwor_mode=mode, scv_mode=scv, backend="cuda", debug=True)
    out = generate(PROMPTS, max_new_tokens=32, k=4, config=cfg, device="cuda")
    assert out.token_ids == reference
    assert out.mean_acceptance_length > 1.5
