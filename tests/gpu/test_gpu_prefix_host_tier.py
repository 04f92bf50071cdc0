"""The prefix cache's host tier on the GPU (written without one: unverified until this runs): pinned
host slots, copies on the tier's own stream fenced by device-side waits. Each shipped prompt twice
through a device cache that evicts it in between, so every second visit restores its blocks from
host memory, with the engine's graphs captured and replayed.

- tokens equal the eager engine's without prefix caching, in every write policy and offload strategy;
  `target_head` keeps that engine's acceptance, `target_only` loses it after a host hit;
- the tier's code on the step's path (offload at eviction, restore at admission) makes no host sync
  (`torch.cuda.set_sync_debug_mode("error")` around it);
- in debug mode every restored block is checked against what left (HostTierMismatch otherwise)."""
import contextlib

import pytest
import torch

from nwor_lab import LabConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

NUM_BLOCKS, BS = 12, 8


@pytest.fixture(scope="module")
def shipped():
    from nwor_lab.model.shipped import load_tiny
    from test_engine_shipped import PROMPTS
    target, head, tok = load_tiny(device="cuda")
    prompts = [tok.encode(t).ids for t in PROMPTS]
    return target, head, prompts + prompts


@contextlib.contextmanager
def sync_errors():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


def no_sync(tier):
    """Run the tier's offload and restore with any host sync an error."""
    evict, extend = tier.on_evict, tier.extend_hits

    def on_evict(block, h):
        with sync_errors():
            evict(block, h)

    def extend_hits(hashes, hits):
        with sync_errors():
            return extend(hashes, hits)
    tier.on_evict, tier.extend_hits = on_evict, extend_hits


def decode(shipped, mode, *, graphs=True, offload=None, debug=False, hook=None, k=4):
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.prefix import PrefixCacheConfig
    target, head, prompts = shipped
    prefix = None if offload is None else PrefixCacheConfig(host_blocks=64, offload=offload)
    e = SpecEngine(target, head if k else None,
                   LabConfig(nwor_mode=mode, scv_mode="graph", backend="cuda", cuda_graph=graphs, debug=debug),
                   k=k, block_size=BS, num_blocks=NUM_BLOCKS if prefix else 256, max_num_seqs=1, prefix_cache=prefix)
    if hook is not None:
        hook(e.prefix.host)
    reqs = [e.add_request(p, 32) for p in prompts]
    e.run()
    acc = {r.req_id: [] for r in reqs}
    for w in e.trace:
        if w.kind == "verify":
            for rid, n, a in zip(w.req_ids, w.drafted, w.accepted):
                if n:
                    acc[rid].append(a)
    return [r.output for r in reqs], [sum(v) / len(v) if v else 0.0 for v in acc.values()], e


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_gpu_host_tier_from_graphs_decodes_what_eager_does(shipped, mode):
    eager, plain, _ = decode(shipped, mode, graphs=False)
    n = len(shipped[2]) // 2
    head_out, head_acc, e = decode(shipped, mode, offload="target_head", hook=no_sync)
    only_out, only_acc, _ = decode(shipped, mode, offload="target_only", hook=no_sync)
    assert head_out == only_out == eager
    s = e.prefix_stats()
    assert s["host_hit_requests"] == n and s["host_hit_tokens"] == s["hit_tokens"] > 0, s
    assert head_acc == plain
    assert sum(only_acc[n:]) < sum(plain[n:]) - 0.5 * n, (only_acc, plain)
    assert e.prefix.host.pool.key.is_pinned() and e.prefix.host.copier.stream is not None
    assert e.runner.graphed_steps > 0


def test_gpu_host_tier_restores_what_left(shipped):
    """Debug mode checks every restored block's digests (target layers, head layer, boundary rows)."""
    eager = decode(shipped, "stage", graphs=False)[0]
    out, _, e = decode(shipped, "stage", graphs=False, offload="target_head", debug=True)
    assert out == eager and e.prefix_stats()["host_restores"] > 0
