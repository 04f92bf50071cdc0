"""Prefix caching on the GPU with the engine's graphs really captured and replayed: prompts that share
a system prompt arrive while others decode, so prefills that start after a hit run in captured
prefill and mixed buckets (and the step body keeps each committed block end's feature on the
device). Tokens must be the eager engine's without prefix caching, in every write policy, with the
boundary lookahead and the cached head; and the hit tokens target-only's."""
import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.bench.timing import run_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SYSTEM = "# Helpers for the command line.\nimport os\nimport sys\n\n\ndef main(argv):\n    "
TURNS = ["return 0\n", "args = parse(argv)\n", "for a in argv:\n", "    return 1\n", "return 0\n", "print(argv)\n"]


@pytest.fixture(scope="module")
def shipped():
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny(device="cuda")
    return target, head, [tok.encode(SYSTEM + t).ids for t in TURNS]


def staggered(target, head, prompts, mode, k, graphs, prefix, lookahead="boundary"):
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.prefix import PrefixCacheConfig
    engine = SpecEngine(target, head if k else None,
                        LabConfig(nwor_mode=mode, scv_mode="graph", backend="cuda", cuda_graph=graphs),
                        k=k, max_num_seqs=4, block_size=8, num_blocks=256,
                        prefix_cache=PrefixCacheConfig(lookahead=lookahead) if prefix else None)
    reqs = run_prompts(engine, prompts, 24, arrival_gap=4)
    return [r.output for r in reqs], engine


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_gpu_prefix_hits_from_graphs_decode_what_eager_does(shipped, mode):
    target, head, prompts = shipped
    eager, _ = staggered(target, head, prompts, mode, 4, graphs=False, prefix=False)
    graphed, engine = staggered(target, head, prompts, mode, 4, graphs=True, prefix=True)
    only, e0 = staggered(target, head, prompts, mode, 0, graphs=True, prefix=True)
    assert graphed == eager == only
    s = engine.prefix_stats()
    assert s["hit_requests"] >= 4 and s["hit_tokens"] == e0.prefix_stats()["hit_tokens"]
    g = engine.runner
    assert g.graphed_steps > 0 and g.replays > 0 and (g.prefill_steps + g.mixed_steps) > 0, vars(g)


@pytest.mark.parametrize("state_mode", ["stage", "snapshots", "cow", "replay"])
def test_gpu_hybrid_hits_from_graphs_decode_what_eager_does(state_mode):
    """A hybrid target (gated DeltaNet + attention): the decode steps replayed from CUDA graphs tap
    their state window's block ends on the device (state.checkpoints); prompts that share a prefix hit
    it and start from its state checkpoint. Tokens must be the eager engine's without prefix caching.
    (Written without a GPU at hand: not run where it was written.)"""
    from nwor_lab.bench.state import toy_pair
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.prefix import PrefixCacheConfig
    target, head = toy_pair(wide=True)
    target, head = target.cuda(), head.cuda()
    shared = [(7 * i + 3) % 32 for i in range(33)]                 # the toy's vocabulary is 32
    prompts = [shared + [i, 10 + i] for i in range(4)] + [shared[:20] + [30, 31, 29]]

    def run(graphs, prefix):
        e = SpecEngine(target, head, LabConfig(nwor_mode="stage", state_mode=state_mode, scv_mode="graph",
                                               cuda_graph=graphs), k=3, block_size=16, max_num_seqs=2,
                       num_blocks=64, prefix_cache=PrefixCacheConfig() if prefix else None)
        outs = []
        for p in prompts:                   # one after another: each finds the earlier ones' blocks
            req = e.add_request(p, 24)
            e.run()
            outs.append(req.output)
        return outs, e

    eager, _ = run(False, False)
    graphed, e = run(True, True)
    assert graphed == eager
    assert e.prefix_stats()["hit_tokens"] == 3 * 32 + 16 and e.prefix.block_states.stats["restored"] == 4
    if not e.states.capture_off:
        assert e.runner.graphed_steps > 0
