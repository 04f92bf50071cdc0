"""Prefix caching in the engine (toy pairs, CPU): hits are shared and decode target-only's tokens in
every write policy, greedy and at T > 0; a registered block holds only committed K/V, bit for bit
target-only's; the lookahead strategies' hit rates; what is refused."""
import pytest
import torch

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.kv.prefix import chain_hashes
from nwor_lab.engine.prefix import HEAD_CACHES, LOOKAHEADS, PrefixCacheConfig
from conftest import toy_engine
from test_engine import CacheAudit

BS = 4


def workload():
    """A shared 10-token system prompt; requests that share 2 or 3 blocks of it, one that repeats a
    prompt whole, one whose hit ends where its next token differs from the cached block's (the
    head's boundary row must be fixed), and a returning conversation (hits decode-written blocks)."""
    g = torch.Generator().manual_seed(11)
    r = lambda n: torch.randint(0, 16, (n,), generator=g).tolist()    # noqa: E731
    shared = r(10)
    a = shared + r(3)
    d_tail = r(5)
    d_tail[0] = (a[8] + 1) % 16                   # differs at position 8: hit of 2 blocks, next token new
    return [a, shared + r(5), list(a), shared[:8] + d_tail, a + r(9) + r(2)]


@pytest.fixture(scope="module")
def pair(toy_eagle1_pair):
    return toy_eagle1_pair


@pytest.fixture(scope="module")
def pair3(toy_eagle3_pair):
    return toy_eagle3_pair


def run(pair, prompts, *, k=4, mode="stage", prefix=None, temperature=0.0, seed=0, observers=(),
        max_num_seqs=1, new=10, returning=True):
    """Requests one after another (max_num_seqs=1: each finds the previous ones' blocks registered).
    With `returning`, the last prompt is the first request's whole conversation plus new turns."""
    e = toy_engine(pair, k=k, mode=mode, cfg=dict(scv_mode="graph"), debug=True, observers=observers,
                   block_size=BS, num_blocks=64, max_num_seqs=max_num_seqs, temperature=temperature, seed=seed,
                   prefix_cache=prefix)
    reqs = []
    for i, p in enumerate(prompts):
        if returning and i == len(prompts) - 1 and reqs:
            e.run()                                      # the first conversation's reply is known now
            p = reqs[0].tokens + p[len(prompts[0]):]
        reqs.append(e.add_request(p, new))
    e.run()
    return [r.output for r in reqs], e, [r.prompt for r in reqs]


@pytest.fixture(scope="module")
def reference(pair):
    return run(pair, workload(), k=0)[0]


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_hits_decode_target_only_tokens_and_cache_holds_committed_kv(pair, reference, mode):
    audit = CacheAudit()
    out, e, prompts = run(pair, workload(), mode=mode, prefix=PrefixCacheConfig(), observers=[audit])
    assert out == reference
    s = e.prefix_stats()
    # a: 0, shared+: 2 blocks, a again: 3 (12 of 13), d: 2, the returning conversation: its first turn
    assert s["hit_requests"] == 4 and s["hit_tokens"] >= 8 + 12 + 8 + 20
    assert s["head_rows_recomputed"] == 1 and s["blocks_copied"] == 1     # d's boundary row
    assert audit.windows == len(e.trace)       # every committed position (hits too) held the dense K/V


# an EAGLE-3 head once (stage); every write policy with hits: test_hits_decode_target_only_tokens_...
@pytest.mark.parametrize("mode", ["stage"])
def test_target_only_and_eagle3_hits(pair3, mode):
    ref = run(pair3, workload(), k=0)[0]
    only, e0, _ = run(pair3, workload(), k=0, mode=mode, prefix=PrefixCacheConfig())
    spec, e3, _ = run(pair3, workload(), mode=mode, prefix=PrefixCacheConfig(), observers=[CacheAudit()])
    assert only == ref and spec == ref
    assert e3.prefix_stats()["hit_tokens"] == e0.prefix_stats()["hit_tokens"] > 0


def test_seeded_sampling_unchanged_by_prefix_caching(pair):
    """At T > 0 with a seed: target-only and speculative decoding (every write policy) sample the same
    tokens with prefix caching as without."""
    kw = dict(temperature=0.9, seed=5)
    only = run(pair, workload(), k=0, **kw)[0]
    on, e, _ = run(pair, workload(), k=0, prefix=PrefixCacheConfig(), **kw)
    assert on == only and e.prefix_stats()["hit_tokens"] > 0
    assert only != run(pair, workload(), k=0)[0]          # it really sampled
    spec = run(pair, workload(), **kw)[0]
    for mode in NWOR_MODES:
        on, e, _ = run(pair, workload(), mode=mode, prefix=PrefixCacheConfig(), **kw)
        assert on == spec and e.prefix.hits == {0: 0, 1: 8, 2: 12, 3: 8, 4: 20}


class RegisteredBlocks:
    """After every window: each registered block's rows hold committed positions only (below its
    holder's num_computed), it was never written since it was registered (every layer, the head's
    too), and its target layers' bytes are kept to compare with target-only's."""

    def __init__(self):
        self.seen, self.whole = {}, {}

    def on_phase(self, event):
        pass

    def on_window_end(self, engine, entry, window):
        al, bs = engine.prefix.allocator, engine.cache.spec.block_size
        for r in engine.scheduler.running:
            for i, b in enumerate(r.block_table.blocks):
                if b in al.hash_of:
                    assert (i + 1) * bs <= r.num_computed, "a registered block past the committed positions"
        for b, h in al.hash_of.items():
            whole = (engine.cache.key[:, b], engine.cache.value[:, b])
            if h in self.whole:
                assert all(torch.equal(x, y) for x, y in zip(whole, self.whole[h])), "a registered block was written"
            else:
                self.whole[h] = [x.clone() for x in whole]
            if h not in self.seen:
                self.seen[h] = [engine.cache.key[:engine.target.num_layers, b].clone(),
                                engine.cache.value[:engine.target.num_layers, b].clone()]


def test_registered_block_equals_target_only(pair):
    """A registered block's target layers against target-only's block for the same tokens: bit for bit
    in every write policy where both wrote it in a prefill (the same passes); where spec wrote it in
    verify windows (1 + k rows a pass) and target-only one row at a time, within the target's own
    arithmetic noise. Across write policies, bit for bit everywhere (the policies compute alike)."""
    only = RegisteredBlocks()
    _, _, prompts = run(pair, workload(), k=0, prefix=PrefixCacheConfig(), observers=[only])
    prefilled = {h for p in prompts[:4] for h in chain_hashes(p, BS)}      # the returning one's were decoded
    seen = {}
    for mode in NWOR_MODES:
        seen[mode] = RegisteredBlocks()
        run(pair, workload(), mode=mode, prefix=PrefixCacheConfig(), observers=[seen[mode]])
    spec = seen[NWOR_MODES[0]].seen
    common = set(spec) & set(only.seen)
    assert len(common & prefilled) >= 5 and len(common - prefilled) >= 5
    for h in common:
        for got, want in zip(spec[h], only.seen[h]):
            if h in prefilled:
                assert torch.equal(got, want)
            else:
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for mode in NWOR_MODES[1:]:
        assert seen[mode].seen.keys() == spec.keys()
        assert all(torch.equal(a, b) for h in spec for a, b in zip(seen[mode].seen[h], spec[h]))


def test_lookahead_hit_rates(pair):
    """boundary keeps target-only's hit tokens; drop_last loses one block per hit."""
    only = run(pair, workload(), k=0, prefix=PrefixCacheConfig())[1].prefix_stats()
    exact = run(pair, workload(), prefix=PrefixCacheConfig(lookahead="boundary"))[1].prefix_stats()
    drop = run(pair, workload(), prefix=PrefixCacheConfig(lookahead="drop_last"))[1].prefix_stats()
    assert exact["hit_tokens"] == only["hit_tokens"] and exact["hit_rate"] == only["hit_rate"]
    assert drop["recomputed_tokens"] == BS * only["hit_requests"]
    assert drop["hit_tokens"] == only["hit_tokens"] - drop["recomputed_tokens"]
    assert drop["prefill_tokens"] == only["prefill_tokens"] + drop["recomputed_tokens"]


def test_strategy_registries_and_settings():
    assert set(HEAD_CACHES) == {"cached", "missing", "recompute"} and set(LOOKAHEADS) == {"drop_last", "boundary"}
    assert HEAD_CACHES["cached"].exact and not HEAD_CACHES["missing"].exact
    with pytest.raises(ValueError, match="head_cache='nope'"):
        PrefixCacheConfig(head_cache="nope")
    with pytest.raises(ValueError, match="lookahead"):
        PrefixCacheConfig(lookahead="nope")


def _engine(pair, config=LabConfig(), **kw):
    target, head = pair
    return SpecEngine(target, head, config, k=2, block_size=BS, num_blocks=32, **kw)


def test_refused_by_name(pair):
    with pytest.raises(ValueError, match="sliding_window"):
        _engine(pair, LabConfig(sliding_window=8), prefix_cache=PrefixCacheConfig())
    with pytest.raises(TypeError, match="PrefixCacheConfig"):
        _engine(pair, prefix_cache={"lookahead": "boundary"})


def test_hybrid_target_under_off_state_refused():
    """A hybrid target runs with prefix caching (tests/test_prefix_hybrid.py) except under a state
    strategy whose live state keeps rejected drafts."""
    from nwor_lab.model.shipped import load_hybrid
    target, head, _ = load_hybrid()
    with pytest.raises(ValueError, match="hybrid target under state_mode='off'"):
        SpecEngine(target, head, LabConfig(state_mode="off"), k=2, block_size=BS, num_blocks=32,
                   prefix_cache=PrefixCacheConfig())


def test_off_by_default(pair):
    e = _engine(pair)
    assert e.prefix is None and e.prefix_stats() is None


# the bucket buffers and the boundary store are the engine's, not a policy's: two policies show it
@pytest.mark.parametrize("mode", ["off", "stage"])
def test_hits_on_padded_bucket_buffers(pair, reference, mode):
    """The captured path's buffers (bucket padding, device metadata, the boundary store written in
    the body), run eagerly on CPU: prompts arrive while others decode, so prefills after a hit run
    in prefill and mixed buckets. (The CUDA capture itself: tests/gpu/test_gpu_prefix.py.)"""
    from nwor_lab.bench.timing import run_prompts
    from nwor_lab.engine.runner import StepRunner
    target, head = pair
    prompts = workload()[:4]
    e = SpecEngine(target, head, LabConfig(nwor_mode=mode), k=3, block_size=BS, num_blocks=64, max_num_seqs=4,
                   prefix_cache=PrefixCacheConfig())
    e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
    reqs = run_prompts(e, prompts, 10, arrival_gap=3)
    assert [r.output for r in reqs] == reference[:4]
    s, g = e.prefix_stats(), e.runner
    assert s["hit_requests"] == 3 and s["head_rows_recomputed"] == 1
    assert g.graphed_steps > 0 and g.prefill_steps + g.mixed_steps > 0


def test_eviction_under_a_small_cache(pair, reference):
    """A cache too small to keep every request's blocks: idle cached blocks are evicted LRU as new
    requests allocate, later prompts hit only what is left, and the tokens stay target-only's."""
    target, head = pair
    e = SpecEngine(target, head, LabConfig(nwor_mode="off", debug=True), k=4, block_size=BS, num_blocks=14,
                   max_num_seqs=1, prefix_cache=PrefixCacheConfig())
    big = run(pair, workload(), prefix=PrefixCacheConfig())[1].prefix_stats()
    prompts = workload()
    reqs = [e.add_request(p, 10) for p in prompts[:4]]
    e.run()
    reqs.append(e.add_request(reqs[0].tokens + prompts[4][len(prompts[0]):], 10))
    e.run()
    assert [r.output for r in reqs] == reference
    s = e.prefix_stats()
    assert s["evictions"] > 0 and 0 < s["hit_tokens"] < big["hit_tokens"]
    assert e.scheduler.allocator.num_free == 14          # every block free again, some still cached
