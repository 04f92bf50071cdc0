"""A hybrid target's recurrent state through the host tier (toy gated DeltaNet + attention, CPU):
with `offload="target_head_state"` an evicted cached block takes its state checkpoint (the
recurrent and conv state after its last row) to host memory and brings it back with the block; the
returning prompts hit the host tier and decode target-only's tokens (greedy) and the same engine's
tokens without prefix caching (seeded T > 0). The strategies that drop the state are refused with a
hybrid target, by name; a checkpoint corrupted on the host is named by the debug check."""
import pytest
import torch

from host_tier_tools import corrupt_on_evict
from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.offload import HostTierMismatch
from nwor_lab.engine.prefix import PrefixCacheConfig
from nwor_lab.model.toy import toy_hybrid, toy_hybrid_head

BS, SMALL = 4, 12


@pytest.fixture(scope="module")
def pair():
    target = toy_hybrid(2)
    return target, toy_hybrid_head(target, 3)


def prompts():
    """Three 13-token prompts, then the same three again: one request at a time in 12 device blocks,
    so each one's cached blocks are evicted (to the host) before it returns."""
    g = torch.Generator().manual_seed(3)
    first = [torch.randint(0, 16, (13,), generator=g).tolist() for _ in range(3)]
    return first + [list(p) for p in first]


def run(pair, *, k=3, prefix=None, temperature=0.0, seed=0, hook=None, state_mode="stage"):
    target, head = pair
    e = SpecEngine(target, head if k else None,
                   LabConfig(nwor_mode="stage" if k else "off", state_mode=state_mode if k else "auto", debug=True),
                   k=k, block_size=BS, num_blocks=SMALL, max_num_seqs=1, temperature=temperature, seed=seed,
                   prefix_cache=prefix)
    if hook is not None:
        hook(e)
    reqs = [e.add_request(p, 8) for p in prompts()]
    e.run()
    return [r.output for r in reqs], e


def host(offload="target_head_state", n=32):
    return PrefixCacheConfig(host_blocks=n, offload=offload)


@pytest.fixture(scope="module")
def reference(pair):
    return run(pair, k=0)[0]


@pytest.mark.parametrize("state_mode", ["stage", "snapshots"])
def test_state_checkpoints_travel_with_their_blocks_greedy(pair, reference, state_mode):
    out, e = run(pair, prefix=host(), state_mode=state_mode)
    s = e.prefix_stats()
    assert out == reference
    # 3 returning prompts hit 3 blocks each; 2 of each 3 came back from the host (the last is still on
    # the device); debug=True checked every restored block's stores, the checkpoints among them
    assert s["host_offloads"] > 0 and s["hit_tokens"] == 3 * 12
    assert s["host_hit_requests"] == 3 and s["host_hit_tokens"] == 3 * 8
    assert {"state.recurrent", "state.conv"} <= set(e.prefix.host.pool.rows)
    assert e.prefix.block_states.stats["restored"] >= 3          # each host hit started from its checkpoint
    # without the host tier the same device cache keeps only what was not evicted: the host's 24 are gone
    assert run(pair, prefix=PrefixCacheConfig())[1].prefix_stats()["hit_tokens"] == 3 * 12 - 3 * 8


def test_seeded_sampling_unchanged_by_the_host_tier(pair):
    kw = dict(temperature=0.9, seed=5)
    spec = run(pair, **kw)[0]
    assert spec != run(pair)[0]                                      # it really sampled
    out, e = run(pair, prefix=host(), **kw)
    assert out == spec and e.prefix_stats()["host_hit_requests"] == 3
    assert run(pair, k=0, prefix=host(), **kw)[0] == run(pair, k=0, **kw)[0]


def test_a_checkpoint_dropped_on_the_host_changes_the_state_and_is_named(pair):
    """The checkpoint is what makes a host hit exact: zero it on the host and the debug check names
    the store (the tokens would otherwise decode from a cleared state)."""
    corrupt = corrupt_on_evict(lambda pool, slot: pool.rows["state.recurrent"][slot].add_(1.0))
    with pytest.raises(HostTierMismatch, match="state.recurrent"):
        run(pair, prefix=host(), hook=corrupt)


@pytest.mark.parametrize("offload", ["target_only", "target_head"])
def test_offloads_without_the_state_are_refused_with_a_hybrid(pair, offload):
    with pytest.raises(ValueError, match="target_head_state"):
        run(pair, prefix=host(offload))
