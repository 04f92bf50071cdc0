"""fla's gated-delta kernels (fla-core, Triton) against the lab's torch references, and the state
strategies on the GPU with fla as their backend. Needs CUDA and fla-core (`pip install fla-core
--no-deps`, plus einops); skipped without them."""
import pytest
import torch

from nwor_lab.ops.gated_delta import fla_available, gated_delta_fla, gated_delta_recurrent_reference
from nwor_lab.ops.generators import gated_delta_inputs

pytestmark = pytest.mark.gpu
NAMES = ("q", "k", "v", "g", "beta")


@pytest.fixture(scope="module", autouse=True)
def fla():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("fla.ops.gated_delta_rule")
    assert fla_available("cuda")


# fla's chunk kernels multiply with tl.dot's default precision (tf32 for float32 inputs): ~1e-3
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-3), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("T,keep", [(1, None), (4, 0), (17, 12), (200, None)])
def test_gpu_fla_matches_the_reference(dtype, tol, T, keep):
    c = gated_delta_inputs(T, num_heads=4, head_k_dim=64, head_v_dim=64, seed=T, dtype=dtype, device="cuda")
    args = tuple(c[n] for n in NAMES) + (c["state"],)
    o, states = gated_delta_fla(*args, keep_from=keep)
    want_o, want_states = gated_delta_recurrent_reference(*(a.float() for a in args), keep_from=keep)
    assert states.shape == want_states.shape
    torch.testing.assert_close(o, want_o, atol=tol, rtol=tol)
    torch.testing.assert_close(states, want_states, atol=tol, rtol=tol)


def test_gpu_strategies_with_fla_agree_with_stage():
    """Every exact strategy commits the same state on the GPU (fla computes the window and the
    recompute; the recompute's prefix runs may round differently: fp32 tolerance)."""
    from nwor_lab.config import LabConfig
    from nwor_lab.state import RecurrentSpec, make_state_policy, make_state_store
    from nwor_lab.window import Acceptance, Window
    spec = RecurrentSpec(num_layers=1, num_heads=4, head_k_dim=64, head_v_dim=64, conv_dim=96, conv_width=4)
    committed = {}
    for mode in ("snapshots", "cow", "replay", "stage"):
        config = LabConfig(state_mode=mode)
        policy = make_state_policy(config, make_state_store(config, spec, 2, 3, device="cuda"))
        window = Window.from_counts([4, 4], [3, 3], torch.arange(8, device="cuda"))
        policy.begin(window, [0, 1])
        c = gated_delta_inputs(8, 4, 64, 64, 96, seed=1, device="cuda")
        policy.conv(0, c["x"], c["weight"])
        policy.recur(0, *(c[n] for n in NAMES))
        policy.commit(Acceptance.from_accepted_len(window, [1, 3]))
        committed[mode] = [t.clone() for s in (0, 1) for t in policy.store.committed(s)]
    for mode, got in committed.items():
        for a, b in zip(got, committed["stage"]):
            torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)
