"""The whole verify step (every layer with the Triton attention, sampler, SCV, commit) captured as
one CUDA graph replays exactly what the eager step does, also after the window's token ids and the
acceptance change between replays (they are the graph's static inputs): same sampled ids, same
cache bits, in every write policy."""
import pytest
import torch

from nwor_lab.bench.step import StepCase
from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.model.shipped import load_tiny
from nwor_lab.ops.graphs import capture_graph
from nwor_lab.policies import make_policy
from nwor_lab.window import Acceptance

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def target():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return load_tiny(device="cuda")[0]


@pytest.mark.parametrize("mode", NWOR_MODES)
@torch.no_grad()
def test_graphed_step_equals_eager_as_inputs_change(target, mode):
    case = StepCase(target, batch=4, k=4, context=37, attention="triton", seed=3)
    policy = make_policy(LabConfig(nwor_mode=mode, validate=False, backend="cuda"), case.cache, records=False)
    policy.reserve(case.window.num_tokens)
    first = case.forced(0.5)
    static = Acceptance(first.draft_mask.clone(), first.accepted_len.clone(), first.commit_mask.clone())
    step = case.step_fn(policy, static)
    start = (case.cache.key.clone(), case.cache.value.clone())
    graph_out = None
    gen = torch.Generator(device="cuda").manual_seed(11)
    for rate in (0.5, 0.25, 1.0):
        acc = case.forced(rate)
        ids = torch.randint(0, target.config.vocab_size, case.ids.shape, device="cuda", generator=gen)
        for t, new in zip((static.draft_mask, static.accepted_len, static.commit_mask),
                          (acc.draft_mask, acc.accepted_len, acc.commit_mask)):
            t.copy_(new)
        case.ids.copy_(ids)
        case.spec.draft_token_ids.copy_(ids.view(case.batch, -1)[:, 1:].reshape(-1))
        # eager from the starting cache
        case.cache.key.copy_(start[0]), case.cache.value.copy_(start[1])
        eager_sampled = step().clone()
        eager_cache = (case.cache.key.clone(), case.cache.value.clone())
        # the graph (captured once, on the first pass) from the same starting cache
        case.cache.key.copy_(start[0]), case.cache.value.copy_(start[1])
        if graph_out is None:      # capture once; its warm-up call runs the step, so reset after
            holder = {}
            graph = capture_graph(lambda: holder.__setitem__("out", step()))
            graph_out = holder["out"]
            case.cache.key.copy_(start[0]), case.cache.value.copy_(start[1])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(graph_out, eager_sampled), (mode, rate)
        assert torch.equal(case.cache.key.view(torch.uint8), eager_cache[0].view(torch.uint8)), (mode, rate)
        assert torch.equal(case.cache.value.view(torch.uint8), eager_cache[1].view(torch.uint8)), (mode, rate)
