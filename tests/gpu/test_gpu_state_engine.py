"""A hybrid target (gated DeltaNet + attention) through the engine on CUDA: every state strategy's
greedy tokens against target-only, and the steps replayed from CUDA graphs against the same steps
run eagerly, token for token, under every strategy (a strategy that cannot be captured declares
why, `StatePolicy.capture_off`, and then runs eagerly: no replay expected)."""
import pytest
import torch

from nwor_lab.bench.state import random_hybrid
from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.state import STATE_POLICIES
from nwor_lab.speculative.synthetic import ForcedAcceptance

pytestmark = pytest.mark.gpu
PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14, 15, 16]]


@pytest.fixture(scope="module")
def pair(hybrid_pair16):
    return hybrid_pair16


def decode(pair, k, state_mode, graphs, max_num_seqs=4, new_tokens=24, acceptance=None, prompts=PROMPTS):
    target, head = pair
    # SCV graph: the acceptance on the device (SCV off is a host loop, which keeps every step eager)
    engine = SpecEngine(target, head if k else None, LabConfig(nwor_mode="stage", state_mode=state_mode,
                                                               scv_mode="graph", cuda_graph=graphs),
                        k=k, block_size=16, max_num_seqs=max_num_seqs, num_blocks=64, acceptance=acceptance)
    outs = []
    for _ in range(3):            # warm-up, capture, replay: the third run replays the buckets' graphs
        reqs = [engine.add_request(p, new_tokens) for p in prompts]
        engine.run()
        outs.append([r.output for r in reqs])
    return outs, engine


@pytest.mark.parametrize("state_mode", [s for s in STATE_POLICIES if s != "off"])
def test_gpu_hybrid_every_exact_strategy_equals_target_only(pair, state_mode):
    want = decode(pair, 0, "stage", False)[0][0]
    outs, engine = decode(pair, 3, state_mode, False)
    assert all(o == want for o in outs), state_mode


@pytest.mark.parametrize("state_mode", list(STATE_POLICIES))
def test_gpu_hybrid_captured_steps_equal_eager_steps(pair, state_mode):
    eager, _ = decode(pair, 3, state_mode, False)
    graphed, engine = decode(pair, 3, state_mode, True)
    assert graphed == eager, state_mode
    reason = getattr(engine.states, "capture_off", None)
    if reason:
        assert engine.runner.replays == 0, reason
    else:
        assert engine.runner.replays > 0, (state_mode, engine.graphed_off)


@pytest.mark.parametrize("state_mode", list(STATE_POLICIES))
def test_gpu_hybrid_8b_mini_forced_acceptance_graphed_equals_eager(state_mode):
    """The bench's random hybrid (forced acceptance: most drafts accepted, unlike the toy's; float32, so that the eager steps' exact-size GEMMs
    and the buckets' padded ones round alike), padding requests in the buckets (3 of 4)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    target, head = random_hybrid("8b-hybrid-mini", "cuda", torch.float32)
    acc = ForcedAcceptance.parse("shipped", 4)
    prompts = PROMPTS[:3]
    eager, _ = decode((target, head), 4, state_mode, False, acceptance=acc, prompts=prompts)
    graphed, engine = decode((target, head), 4, state_mode, True, acceptance=acc, prompts=prompts)
    assert graphed == eager
    assert engine.runner.replays > 0 and 4 in {inp.size for inp in engine.runner.buckets.values()}
