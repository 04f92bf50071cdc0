"""Prefix caching and preemption together (toy pair, CPU): requests that share a system prompt in a
cache too small for the batch get prefix hits and are preempted (recompute: re-admitted through the
prefix cache, hitting their own committed blocks; swap: resumed in fresh private blocks), and every
request decodes target-only's tokens under every write policy; a mid-window abort leaves the other
requests' tokens alone. Freed shared blocks keep their registrations (the allocator's refcounts)."""
import pytest
import torch

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.preemption import Preemption
from nwor_lab.engine.prefix import PrefixCacheConfig
from nwor_lab.model.toy import toy_pair

BS, SMALL, BIG = 4, 14, 96


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


def prompts():
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(0, 16, (9,), generator=g).tolist()         # two full blocks and one token
    return [shared + torch.randint(0, 16, (n,), generator=g).tolist() for n in (2, 5, 1, 4, 3)]


def decode(pair, *, k=4, mode="stage", num_blocks=BIG, prefix=None, preemption=None, abort_at=None):
    target, head = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=mode, scv_mode="graph", debug=True), k=k,
                   block_size=BS, num_blocks=num_blocks, max_num_seqs=3, prefix_cache=prefix, preemption=preemption)
    reqs = [e.add_request(p, 12) for p in prompts()]
    steps = 0
    while e.scheduler.has_work:
        e.step_with_progress()
        steps += 1
        if abort_at is not None and steps == abort_at:
            e.abort(reqs[1].req_id)
    return e, [r.output for r in reqs]


@pytest.fixture(scope="module")
def reference(pair):
    return decode(pair, k=0)[1]


@pytest.mark.parametrize("how", ["recompute", "swap"])
@pytest.mark.parametrize("mode", NWOR_MODES)
def test_hits_and_preemption_decode_target_only(pair, reference, mode, how):
    e, out = decode(pair, mode=mode, num_blocks=SMALL, prefix=PrefixCacheConfig(), preemption=Preemption(how))
    assert out == reference
    assert e.preemption_stats.preemptions > 0
    assert e.prefix_stats()["hit_tokens"] > 0
    al = e.scheduler.allocator
    assert al.num_free == al.num_blocks and not al.refs      # every holder gone; registered blocks idle


def test_abort_beside_hits_leaves_the_others_tokens(pair, reference):
    e, out = decode(pair, num_blocks=SMALL, prefix=PrefixCacheConfig(), preemption=Preemption("recompute"),
                    abort_at=2)
    assert e.preemption_stats.aborted == 1
    assert [o for i, o in enumerate(out) if i != 1] == [o for i, o in enumerate(reference) if i != 1]
