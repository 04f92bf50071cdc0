"""A hybrid target's state checkpoints through the host tier on the GPU (written without one:
unverified until this runs): `offload="target_head_state"` takes each evicted block's recurrent and
conv state checkpoint to pinned host memory on the tier's own stream and brings it back with the
block. The toy hybrid (gated DeltaNet + attention), each prompt twice through a device cache that
evicts it in between: tokens equal target-only's (greedy) and the same engine's without prefix
caching (seeded T > 0), eager and with the engine's graphs, and the debug round-trip check passes
(every restored block, its checkpoint included, is what left)."""
import pytest
import torch

from nwor_lab import LabConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BS, SMALL = 4, 12


@pytest.fixture(scope="module")
def pair(hybrid_pair16):
    return hybrid_pair16


def prompts():
    g = torch.Generator().manual_seed(3)
    first = [torch.randint(0, 16, (13,), generator=g).tolist() for _ in range(3)]
    return first + [list(p) for p in first]


def run(pair, *, k=3, prefix=None, temperature=0.0, graphs=False):
    from nwor_lab.engine import SpecEngine
    target, head = pair
    cfg = LabConfig(nwor_mode="stage" if k else "off", state_mode="stage" if k else "auto", debug=True,
                    cuda_graph=graphs)
    e = SpecEngine(target, head if k else None, cfg, k=k, block_size=BS, num_blocks=SMALL, max_num_seqs=1,
                   temperature=temperature, seed=5, prefix_cache=prefix)
    reqs = [e.add_request(p, 8) for p in prompts()]
    e.run()
    return [r.output for r in reqs], e


@pytest.mark.parametrize("graphs", [False, True])
def test_state_checkpoints_travel_with_their_blocks_on_cuda(pair, graphs):
    from nwor_lab.engine.prefix import PrefixCacheConfig
    host = PrefixCacheConfig(host_blocks=32, offload="target_head_state")
    ref = run(pair, k=0)[0]
    out, e = run(pair, prefix=host, graphs=graphs)
    s = e.prefix_stats()
    assert out == ref and s["host_hit_requests"] == 3 and s["host_restores"] > 0
    assert e.prefix.host.pool.rows["state.recurrent"].is_pinned()
    sampled = run(pair, temperature=0.9, graphs=graphs)[0]
    assert run(pair, prefix=host, temperature=0.9, graphs=graphs)[0] == sampled
