"""Prefix caching on a hybrid target (gated DeltaNet + attention): every state strategy that commits
accepted rows only decodes target-only's tokens with prefix caching on (greedy, and seeded T > 0);
the state checkpoint of every registered block is bit for bit the state a fresh prefill of that
prefix leaves; `off` (its live state keeps rejected drafts) is refused by name while drafting."""
import pytest
import torch

from nwor_lab.engine.prefix import PrefixCacheConfig
from nwor_lab.kv.prefix import chain_hashes
from nwor_lab.state import STATE_POLICIES
from conftest import toy_engine

BS = 4
EXACT = sorted(m for m, cls in STATE_POLICIES.items() if cls.commits_accepted_only)


def workload():
    """A shared system prompt, a returning prompt, a hit that stops mid-prompt, a long prompt (past
    the token-by-token form: its prefill is segmented at block ends) and a returning conversation."""
    g = torch.Generator().manual_seed(3)
    r = lambda n: torch.randint(0, 16, (n,), generator=g).tolist()    # noqa: E731
    shared = r(10)
    a = shared + r(3)
    return [a, shared + r(5), list(a), shared[:8] + r(5), shared + r(14)], a


@pytest.fixture(scope="module")
def pair(toy_hybrid_pair):
    return toy_hybrid_pair


def engine(pair, k, state_mode="stage", prefix=None, nwor_mode="stage", num_blocks=64, max_num_seqs=1, **kw):
    """The one engine set-up of this file: block size BS, a hybrid target (k=0: target-only)."""
    return toy_engine(pair, k=k, mode=nwor_mode, state_mode=state_mode, block_size=BS, num_blocks=num_blocks,
                      max_num_seqs=max_num_seqs, prefix_cache=prefix, **kw)


def decode_one_by_one(e, prompts, max_new=12):
    outs = []
    for p in prompts:
        req = e.add_request(p, max_new)
        e.run()
        outs.append(req.output)
    return outs


def run(pair, k, state_mode="stage", prefix=None, temperature=0.0, seed=0, nwor_mode="stage"):
    e = engine(pair, k, state_mode, prefix, nwor_mode, temperature=temperature, seed=seed)
    prompts, first = workload()
    outs = decode_one_by_one(e, prompts)
    req = e.add_request(first + outs[0] + [1, 2], 6)          # the first conversation returns
    e.run()
    outs.append(req.output)
    return outs, e


@pytest.fixture(scope="module")
def target_only(pair):
    return run(pair, 0, "auto", nwor_mode="off")[0]


@pytest.mark.parametrize("state_mode", EXACT)
def test_every_exact_strategy_decodes_target_only_tokens_with_hits(pair, target_only, state_mode):
    out, e = run(pair, 3, state_mode, PrefixCacheConfig())
    assert out == target_only
    st = e.prefix_stats()
    assert st["hit_tokens"] >= 40 and e.prefix.block_states.stats["restored"] >= 4
    drafted = sum(sum(t.drafted) for t in e.trace if t.kind == "verify")
    accepted = sum(sum(t.accepted) for t in e.trace if t.kind == "verify")
    assert 0 < accepted < drafted                     # windows rejected drafts beside the checkpoints


def test_target_only_with_hits_and_the_lookaheads(pair, target_only):
    out, e = run(pair, 0, "auto", PrefixCacheConfig(), nwor_mode="off")
    assert out == target_only and e.prefix_stats()["hit_tokens"] >= 40
    out, e = run(pair, 3, "stage", PrefixCacheConfig(lookahead="drop_last"))
    assert out == target_only and e.prefix_stats()["recomputed_tokens"] > 0


def test_a_hit_restores_the_state_it_would_have(pair, target_only):
    """Without the restore (the slot left empty) a hit's tokens go wrong: the checkpoint matters."""
    out, e = run(pair, 3, "stage", PrefixCacheConfig())
    assert out == target_only
    from nwor_lab.state.checkpoints import BlockStates
    restore = BlockStates.restore
    try:
        BlockStates.restore = lambda self, store, slot, block: None
        assert run(pair, 3, "stage", PrefixCacheConfig())[0] != target_only
    finally:
        BlockStates.restore = restore


# two strategies on the engine's bucket path (a recurrent-state one and a snapshot one); every exact
# strategy in the device layout, checkpoints included: test_state / test_prefix_state (op level)
@pytest.mark.parametrize("state_mode", ["stage", "snapshots"])
def test_padded_bucket_steps_with_hits(pair, target_only, state_mode):
    """The decode steps on their bucket's padded buffers (the body a CUDA graph captures, run here
    without one): the state window in the device layout, its checkpoints gathered on the device."""
    from nwor_lab.engine.runner import StepRunner
    e = engine(pair, 3, state_mode, PrefixCacheConfig())
    e.runner = StepRunner(e, 1, 1024, capture=False, pad=True)
    prompts, _ = workload()
    outs = decode_one_by_one(e, prompts)
    assert outs == target_only[:len(prompts)] and e.prefix_stats()["hit_tokens"] >= 30
    assert e.runner.buckets                                          # the decode steps ran on buckets


def test_seeded_sampling_unchanged_by_prefix_caching(pair):
    kw = dict(temperature=0.9, seed=5)
    off = run(pair, 3, "stage", **kw)[0]
    assert off != run(pair, 3, "stage")[0]                  # it really sampled
    for mode in EXACT:
        assert run(pair, 3, mode, PrefixCacheConfig(), **kw)[0] == off, mode


def state_at(pair, tokens, n):
    """Target-only without prefix caching (no checkpoints, no segmented prefill): its slot's state once
    `n` tokens of `tokens` are computed (the prompt `tokens[:n]` prefilled whole when n = len(tokens),
    else the prompt prefilled and the rest decoded one token a step)."""
    e = engine(pair, 0, "auto", nwor_mode="off")
    req = e.add_request(tokens[:min(n, len(tokens))], 64)
    while req.num_computed < n:
        e.step()
    return [t.clone() for t in e.states.store.committed(req.state_slot)]


def test_checkpoints_equal_target_only_states(pair):
    """A prompt of whole blocks (<= 16 tokens: the token-by-token form either way) prefilled by
    speculative decoding with prefix caching (segmented at block ends): its last block's checkpoint is
    bit for bit the state target-only's plain prefill of that prompt leaves. Blocks the decode wrote
    (verify windows of 1 + k rows, drafts rejected) match target-only's one-row decode within the
    model's own arithmetic noise (its elementwise kernels round differently for another row count),
    and are bit for bit alike across every exact strategy (they compute alike)."""
    prompt = workload()[0][1][:12]
    pools = {}
    for mode in EXACT:
        _, e = run_one(pair, mode, prompt)
        al, pool = e.prefix.allocator, e.prefix.block_states
        pools[mode] = {h: (pool.recurrent[:, b].clone(), pool.conv[:, b].clone()) for h, b in al.block_of.items()}
    hashes = chain_hashes(e.last_sequence, BS)
    assert set(hashes) <= set(pools["stage"]) and len(hashes) >= 6
    rec, conv = pools["stage"][hashes[2]]
    want = state_at(pair, prompt, 12)
    assert torch.equal(rec, want[0]) and torch.equal(conv, want[1])
    for b in range(3, len(hashes)):
        rec, conv = pools["stage"][hashes[b]]
        want = state_at(pair, e.last_sequence, (b + 1) * BS)
        torch.testing.assert_close(rec, want[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(conv, want[1], atol=1e-5, rtol=1e-5)
    for mode in EXACT:
        assert pools[mode].keys() == pools["stage"].keys()
        assert all(torch.equal(x, y) for h in pools[mode] for x, y in zip(pools[mode][h], pools["stage"][h])), mode


def run_one(pair, state_mode, prompt):
    e = engine(pair, 3, state_mode, PrefixCacheConfig())
    req = e.add_request(prompt, 14)
    e.run()
    e.last_sequence = prompt + req.output
    drafted = sum(sum(t.drafted) for t in e.trace if t.kind == "verify")
    accepted = sum(sum(t.accepted) for t in e.trace if t.kind == "verify")
    assert 0 < accepted < drafted
    return req, e


def test_off_is_refused_while_drafting(pair):
    with pytest.raises(ValueError, match="rejected drafts"):
        run(pair, 3, "off", PrefixCacheConfig())


# the two (strategy, way) pairs test_preemption.test_hybrid_target_preempts leaves out
@pytest.mark.parametrize("state_mode,how", [("stage", "recompute"), ("snapshots", "swap")])
def test_hits_beside_preemption(pair, state_mode, how):
    """Requests that share a prefix on a cache too small for all of them: a request preempted by
    recompute is admitted again with hits (its slot restored from the checkpoint), a swapped one gets
    its own slot back; every request decodes target-only's tokens."""
    from nwor_lab.engine.preemption import Preemption
    from test_prefix_preemption import prompts

    def go(k, state_mode, num_blocks, prefix=None, preemption=None):
        e = engine(pair, k, state_mode, prefix, num_blocks=num_blocks, max_num_seqs=3, preemption=preemption)
        reqs = [e.add_request(p, 12) for p in prompts()]
        e.run()
        return e, [r.output for r in reqs]

    reference = go(0, "auto", 96)[1]
    e, out = go(3, state_mode, 14, PrefixCacheConfig(), Preemption(how))
    assert out == reference
    assert e.preemption_stats.preemptions > 0 and e.prefix_stats()["hit_tokens"] > 0
    assert sorted(e.free_state_slots) == list(range(3))
