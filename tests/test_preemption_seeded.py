"""Seeded T > 0 across preemption, CPU, toy pair: requests with their own generator
(`add_request(generator=)`, vLLM's per-request seeds) decode the same tokens in a cache so small
that they are preempted (recompute or swap) as in a cache with room for all: each draws only from
its own stream, and a preempted one resumes it where it left off (under `recompute` a seeded request
is swapped instead: `PreemptionStats.swapped_for_seed`). The engine's single generator gives no such
promise (tests/test_preemption.py); the contrast is checked here too, so the equality is not luck.
"""
import pytest
import torch

from nwor_lab.engine.preemption import Preemption
from conftest import toy_engine
from test_preemption import BIG, SMALL, prompts

T, MAX_NEW = 0.8, 14


@pytest.fixture(scope="module")
def pair(toy_eagle1_pair):
    return toy_eagle1_pair


def decode(pair, num_blocks, how="recompute", seeded=True):
    e = toy_engine(pair, k=4, mode="stage", num_blocks=num_blocks, block_size=4, max_num_seqs=4,
                   temperature=T, seed=0, preemption=Preemption(how))
    reqs = [e.add_request(p, MAX_NEW, generator=torch.Generator().manual_seed(100 + i) if seeded else None)
            for i, p in enumerate(prompts(6))]
    e.run()
    return e, reqs


@pytest.fixture(scope="module")
def unpreempted(pair):
    e, reqs = decode(pair, BIG)
    assert e.preemption_stats.preemptions == 0
    return [r.output for r in reqs]


@pytest.mark.parametrize("how", ["recompute", "swap"])
def test_seeded_requests_continue_their_stream_across_preemption(pair, unpreempted, how):
    e, reqs = decode(pair, SMALL, how)
    stats = e.preemption_stats
    assert sum(r.preemptions > 0 for r in reqs) >= 2          # preempted (and resumed) while decoding
    assert [r.output for r in reqs] == unpreempted
    assert stats.recomputed_tokens == 0                       # seeded: swapped, never re-prefilled
    assert stats.swapped_for_seed == (stats.preemptions if how == "recompute" else 0)


def test_without_their_own_generators_preemption_changes_the_tokens(pair):
    _, big = decode(pair, BIG, seeded=False)
    e, small = decode(pair, SMALL, "swap", seeded=False)
    assert e.preemption_stats.preemptions > 0
    assert [r.output for r in small] != [r.output for r in big]


def test_a_bad_generator_is_refused_by_name(pair):
    e = toy_engine(pair, num_blocks=BIG, block_size=4, temperature=T)
    with pytest.raises(TypeError, match=r"generator: expected a torch.Generator"):
        e.add_request([1, 2], 4, generator=7)
    tree = toy_engine(pair, num_blocks=BIG, block_size=4, temperature=T, cfg={"tree": "topk=2,depth=2,nodes=4"})
    with pytest.raises(ValueError, match=r"generator: per-request generators with LabConfig.tree="):
        tree.add_request([1, 2], 4, generator=torch.Generator())
    assert not e.scheduler.waiting and not tree.scheduler.waiting
