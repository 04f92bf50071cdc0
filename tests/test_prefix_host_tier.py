"""The prefix cache's host tier (toy pair, CPU): a device cache small enough that cached blocks are
evicted, a host pool big enough to keep them; returning prompts hit the host tier, decode target-only's
tokens in every write policy (greedy and seeded T > 0), and get back bit for bit what left; the debug
check names a block that came back different; the pool's LRU and what is refused."""
import pytest
import torch

from host_tier_tools import corrupt_on_evict
from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.offload import OFFLOADS, HostTierMismatch
from nwor_lab.engine.prefix import PrefixCacheConfig
from nwor_lab.kv.host_tier import HostBlockPool
from nwor_lab.model.toy import toy_pair

BS, SMALL = 4, 10


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


def prompts():
    """Four 13-token prompts, then the same four again: with one request at a time in 10 device
    blocks, each one's cached blocks are evicted before it returns."""
    g = torch.Generator().manual_seed(3)
    first = [torch.randint(0, 16, (13,), generator=g).tolist() for _ in range(4)]
    return first + [list(p) for p in first]


def run(pair, *, k=4, mode="stage", prefix=None, temperature=0.0, seed=0, debug=True, num_blocks=SMALL, hook=None,
        cache_dtype="auto"):
    target, head = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=mode, scv_mode="graph", debug=debug), k=k,
                   block_size=BS, num_blocks=num_blocks, max_num_seqs=1, temperature=temperature, seed=seed,
                   prefix_cache=prefix, cache_dtype=cache_dtype)
    if hook is not None:
        hook(e)
    reqs = [e.add_request(p, 10) for p in prompts()]
    e.run()
    return [r.output for r in reqs], e


def host(offload="target_head", n=64, **kw):
    return PrefixCacheConfig(host_blocks=n, offload=offload, **kw)


@pytest.fixture(scope="module")
def reference(pair):
    return run(pair, k=0)[0]


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_returning_prompts_hit_the_host_tier_and_decode_target_only_tokens(pair, reference, mode):
    out, e = run(pair, mode=mode, prefix=host())
    assert out == reference
    s = e.prefix_stats()
    assert s["evictions"] > 0 and s["host_offloads"] > 0
    assert s["host_hit_requests"] == 4 and s["host_hit_tokens"] == s["hit_tokens"] == 4 * 12
    assert s["host_bytes_offloaded"] == s["host_offloads"] * e.prefix.host.pool.slot_bytes
    assert s["host_bytes_restored"] == s["host_restores"] * e.prefix.host.pool.slot_bytes > 0
    # without the host tier the same device cache hits nothing: the tier is where the hits came from
    assert run(pair, mode=mode, prefix=PrefixCacheConfig())[1].prefix_stats()["hit_tokens"] == 0


@pytest.mark.parametrize("offload", list(OFFLOADS))
def test_every_offload_keeps_tokens_target_only_too(pair, reference, offload):
    """target_only drops the head's K/V, yet the target verifies: tokens stay exact (and a k = 0
    engine, which has no head layer, hits the host alike)."""
    assert run(pair, prefix=host(offload))[0] == reference
    out, e = run(pair, k=0, prefix=host(offload))
    assert out == reference and e.prefix_stats()["host_hit_tokens"] == 4 * 12


@pytest.mark.parametrize("offload", ["target_head", "target_only"])
def test_an_fp8_cache_travels_as_its_bytes(pair, offload):
    """fp8 storage goes to the host and back as it is (the per-layer scales stay on the device)."""
    ref = run(pair, k=0, cache_dtype="fp8_e4m3")[0]
    out, e = run(pair, prefix=host(offload), cache_dtype="fp8_e4m3")
    assert out == ref and e.prefix.host.pool.key.dtype == torch.float8_e4m3fn
    assert e.prefix_stats()["host_hit_requests"] == 4


def test_seeded_sampling_unchanged_by_the_host_tier(pair):
    kw = dict(temperature=0.9, seed=5)
    only = run(pair, k=0, **kw)[0]
    assert only != run(pair, k=0)[0]                                  # it really sampled
    spec = run(pair, **kw)[0]
    for mode in NWOR_MODES:
        out, e = run(pair, mode=mode, prefix=host(), **kw)
        assert out == spec and e.prefix_stats()["host_hit_requests"] == 4
    assert run(pair, k=0, prefix=host(), **kw)[0] == only


def record_round_trips(e, seen):
    """Wrap the tier: every evicted block's bytes (all layers, boundary rows) as they were on the
    device, and every restored block's bytes once it is back, by hash."""
    tier, cache = e.prefix.host, e.cache
    rows = lambda b: [t.select(d, b).clone() for t, d, _ in tier.all_rows.values()]  # noqa: E731
    whole = lambda b: [cache.key[:, b].clone(), cache.value[:, b].clone()] + rows(b)  # noqa: E731
    evict, restore = tier.on_evict, tier._restore

    def on_evict(block, h):
        seen["left"].setdefault(h, whole(block))
        evict(block, h)

    def _restore(slots, blocks):
        restore(slots, blocks)
        for (_, h), b in zip(slots, blocks):
            seen["back"].append((h, whole(b)))
    tier.on_evict, tier._restore = on_evict, _restore


@pytest.mark.parametrize("offload", ["target_head", "target_only"])
def test_restored_blocks_equal_what_left_bit_for_bit(pair, offload):
    seen = {"left": {}, "back": []}
    _, e = run(pair, mode="off", prefix=host(offload), hook=lambda e: record_round_trips(e, seen))
    nt = e.target.num_layers
    assert len(seen["back"]) >= 8
    for h, back in seen["back"]:
        left = seen["left"][h]
        if offload == "target_head":
            assert all(torch.equal(a, b) for a, b in zip(back, left))
        else:   # the target's layers came back; the head's layer and the boundary row did not
            assert torch.equal(back[0][:nt], left[0][:nt]) and torch.equal(back[1][:nt], left[1][:nt])
            assert not back[0][nt:].any() and not back[1][nt:].any()
            assert (back[3] == -1).all() and not back[2].any()


def test_debug_check_names_a_block_that_came_back_different(pair):
    # one element of the target's layer 0
    corrupt = corrupt_on_evict(lambda pool, slot: pool.key[slot, 0, 0, 0, 0].add_(1.0))
    with pytest.raises(HostTierMismatch, match="target layers"):
        run(pair, prefix=host(), hook=corrupt)


def test_a_small_host_pool_drops_lru_and_stays_exact(pair, reference):
    out, e = run(pair, prefix=host(n=4))
    s = e.prefix_stats()
    assert out == reference
    assert s["host_dropped"] > 0 and s["host_blocks_used"] == 4 and s["host_hit_tokens"] < 4 * 12


def test_host_pool_lru_and_held_slots():
    pool = HostBlockPool(2, (1, 2, 1, 1), torch.float32, rows={"t": ((), torch.long)})
    assert pool.slot_bytes == 2 * 2 * 4 + 8
    a, b = pool.reserve(b"a"), pool.reserve(b"b")
    assert pool.find(b"a") == a                      # a is now the most recently used
    assert pool.reserve(b"c") == b and b"b" not in pool and pool.dropped == 1
    pool.hold([a, b])
    assert pool.reserve(b"d") is None                # every slot is being read
    pool.release([a])
    assert pool.reserve(b"d") == a
    with pytest.raises(ValueError, match="num_slots"):
        HostBlockPool(0, (1,), torch.float32)


def test_settings_and_registry(pair):
    assert set(OFFLOADS) == {"target_only", "target_head", "target_head_state"}
    assert not OFFLOADS["target_only"].exact and OFFLOADS["target_head"].keeps_head
    assert OFFLOADS["target_head_state"].keeps_state and not OFFLOADS["target_head"].keeps_state
    with pytest.raises(ValueError, match="offload='nope'"):
        PrefixCacheConfig(host_blocks=4, offload="nope")
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match="host_blocks"):
            PrefixCacheConfig(host_blocks=bad)
    target, head = pair
    e = SpecEngine(target, head, LabConfig(), k=2, block_size=BS, num_blocks=32, prefix_cache=PrefixCacheConfig())
    assert e.prefix.host is None and not any(k.startswith("host_") for k in e.prefix_stats())


def test_hybrid_target_refused_without_its_state():
    """(target_head_state carries a hybrid's state: tests/test_host_tier_hybrid.py)"""
    from nwor_lab.engine.offload import TargetHead
    from nwor_lab.model.toy import toy_hybrid
    with pytest.raises(ValueError, match="hybrid"):
        TargetHead().check(type("E", (), {"target": toy_hybrid(0)})())


@pytest.mark.parametrize("preempt", ["recompute", "swap"])
@pytest.mark.parametrize("mode", ["off", "stage"])
def test_host_tier_beside_preemption(pair, mode, preempt):
    """Requests sharing a system prompt preempted in a cache too small for the batch: blocks go to the
    host and come back while others are preempted and resumed; tokens stay target-only's, and every
    block is free again at the end."""
    from nwor_lab.engine.preemption import Preemption
    from test_prefix_preemption import SMALL as NB, decode
    ref = decode(pair, k=0)[1]
    e, out = decode(pair, mode=mode, num_blocks=NB, prefix=host(n=32), preemption=Preemption(preempt))
    s = e.prefix_stats()
    assert out == ref and e.preemption_stats.preemptions > 0 and s["host_offloads"] > 0
    assert e.scheduler.allocator.num_free == NB and not e.prefix.host.pool.held
