"""The engine's step body captured as one CUDA graph replays exactly what the same body does run
eagerly on the same buffers (every layer with the Triton attention, sampler with forced acceptance,
SCV, head pass, commit, draft chain): same packed outputs, same cache bits, in every write policy,
from the same inputs and cache. `bench step` times these very calls (nwor_lab.bench.step.StepCase)."""
import pytest
import torch

from nwor_lab.bench.step import StepCase, _restore
from nwor_lab.config import NWOR_MODES
from nwor_lab.engine.step import run_step
from nwor_lab.model.shipped import load_tiny

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pair():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    target, head, _ = load_tiny(device="cuda")
    return target, head


@pytest.mark.parametrize("mode", NWOR_MODES)
@torch.no_grad()
def test_captured_step_equals_the_body_run_eagerly(pair, mode):
    case = StepCase(pair, batch=4, k=4, context=37, mode=mode, rate=0.5, attention="triton")
    inp, e = case.inputs, case.engine
    assert inp is not None and inp.graph is not None
    start = (e.cache.key.clone(), e.cache.value.clone())
    # the body, eagerly, on the bucket's own buffers
    _restore(*case.saved[1])
    eager = run_step(e, inp)[0].clone()
    eager_cache = (e.cache.key.clone(), e.cache.value.clone())
    # the captured graph from the same inputs and cache
    e.cache.key.copy_(start[0]), e.cache.value.copy_(start[1])
    case.replay()
    torch.cuda.synchronize()
    assert torch.equal(inp.outputs[0], eager), mode
    assert torch.equal(e.cache.key.view(torch.uint8), eager_cache[0].view(torch.uint8)), mode
    assert torch.equal(e.cache.value.view(torch.uint8), eager_cache[1].view(torch.uint8)), mode
    # the bench's eager timing runs the same body on exact-size buffers: the same verdicts
    e.cache.key.copy_(start[0]), e.cache.value.copy_(start[1])
    exact = case.eager()[0]
    k = e.k
    assert torch.equal(exact[:, :k + 2], eager[:4, :k + 2]), mode
