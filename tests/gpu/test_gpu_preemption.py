"""Preemption on the GPU with the engine's graphs captured and replayed (and steps pre-launched): a
cache too small for the batch preempts by recompute and by swap (pinned host copies), with and
without prefix caching, and every request decodes the tokens of the eager engine with a big cache,
in every write policy."""
import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.bench.timing import run_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = ["def parse_args(argv):", "import os\nclass Config:", "for i in range(", "    return",
           "def main(argv):\n    ", "class Cache:\n    def __init__(self):"]


@pytest.fixture(scope="module")
def shipped():
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny(device="cuda")
    return target, head, [tok.encode(p).ids for p in PROMPTS]


def decode(shipped, mode, graphs, num_blocks, how=None, prefix=False):
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.preemption import Preemption
    from nwor_lab.engine.prefix import PrefixCacheConfig
    target, head, prompts = shipped
    engine = SpecEngine(target, head, LabConfig(nwor_mode=mode, backend="cuda", cuda_graph=graphs), k=4,
                        max_num_seqs=4, block_size=8, num_blocks=num_blocks,
                        preemption=Preemption(how) if how else None,
                        prefix_cache=PrefixCacheConfig() if prefix else None)
    reqs = run_prompts(engine, prompts, 40, arrival_gap=3)
    return [r.output for r in reqs], engine


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("how", ["recompute", "swap"])
@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_gpu_small_cache_preempts_from_graphs(shipped, mode, how, prefix):
    big, _ = decode(shipped, mode, graphs=False, num_blocks=256)
    small, engine = decode(shipped, mode, graphs=True, num_blocks=16, how=how, prefix=prefix)
    assert small == big
    assert engine.preemption_stats.preemptions > 0
    assert engine.runner.replays > 0
    if how == "swap":
        s = engine.preemption_stats
        assert s.swapped_out_bytes > 0 and s.swapped_in_bytes == s.swapped_out_bytes
