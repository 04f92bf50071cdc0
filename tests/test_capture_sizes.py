"""The buckets captured at engine start (nwor_lab.engine.capture_sizes): the set of bucket keys a
configuration can reach covers every bucket real steps reach, and a bucket warmed up on padding
only leaves no trace (the same tokens, records, cache and draws afterwards). On CPU nothing
captures: the runner runs the same bodies eagerly; the capture is tests/gpu/test_gpu_sampling_graphs.py's."""
import pytest
import torch

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.buffers import prefill_token_buckets, slot_sizes, token_bucket
from nwor_lab.engine.capture_sizes import (START_MAX_ROWS, capture_buckets, reachable_buckets,
                                          start_buckets)
from nwor_lab.engine.runner import StepRunner
from nwor_lab.model.toy import toy_pair

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14], [3, 3, 3], list(range(1, 15)) * 2]


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


def engine(pair, *, mode="stage", k=3, temperature=0.0, max_num_seqs=4, budget=64, **cfg):
    target, head = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=mode, **cfg), k=k, block_size=4,
                   max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, temperature=temperature, seed=3)
    e.runner = StepRunner(e, max_num_seqs, budget, capture=False, pad=True)
    return e


def run(e):
    reqs = [e.add_request(p, 14) for p in PROMPTS]
    e.run()
    return [r.output for r in reqs], [(t.kind, t.record.to_dict() if t.record else None) for t in e.trace]


def test_slot_and_token_buckets():
    assert slot_sizes(1) == [1] and slot_sizes(8) == [1, 2, 4, 8]
    # 4 slots hold 3 or 4 requests: 3 rows at least; up to 64 rows (a bucket of 128: over 100 reserved)
    assert token_bucket(64) == 128
    assert prefill_token_buckets(4, 64, 100) == [16, 32, 64]
    # from 128 rows eight buckets a doubling (then multiples of 512 from 1024)
    assert prefill_token_buckets(1, 2048, 4096) == [16, 32, 64, 128, *range(144, 257, 16), *range(288, 513, 32),
                                                    *range(576, 1025, 64), 1536, 2048, 2560]
    assert prefill_token_buckets(2, 300, 321) == [16, 32, 64, 128, *range(144, 257, 16), 288, 320]


@pytest.mark.parametrize("k", [0, 3])
def test_every_bucket_a_run_reaches_is_enumerated(pair, k):
    e = engine(pair, k=k)
    keys = set(reachable_buckets(e.runner))
    run(e)
    reached = set(e.runner.buckets)
    assert reached and reached <= keys, reached - keys
    # decode buckets of 1, 2 and 4 slots, with k + 1 rows a slot and one padding row
    assert {(s, s * (k + 1) + 1, k + 1, bool(k), False, k) for s in (1, 2, 4)} <= keys


def test_large_prefill_buckets_are_left_to_their_first_use(pair):
    e = engine(pair, budget=4096)
    keys, start = reachable_buckets(e.runner), start_buckets(e.runner)
    assert max(key[1] for key in keys) > START_MAX_ROWS >= max(key[1] for key in start if not key[2])
    assert [key for key in keys if key[2]] == [key for key in start if key[2]]      # every decode bucket


def test_engines_that_never_use_buckets_enumerate_none(pair):
    assert reachable_buckets(engine(pair, debug=True).runner) == []
    assert reachable_buckets(engine(pair, tree="topk=2,depth=2,nodes=4").runner) == []   # trees: on first use


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("mode", NWOR_MODES)
def test_buckets_warmed_on_padding_leave_no_trace(pair, mode, temperature):
    """Every reachable bucket's warm-up and capture body, run on padding before the first request:
    the cache is untouched, the generator is where it was, and the run decodes the same tokens
    and records as an engine that warmed nothing (seeded T > 0 included)."""
    plain = run(engine(pair, mode=mode, temperature=temperature))
    e = engine(pair, mode=mode, temperature=temperature)
    key, value = e.cache.key.clone(), e.cache.value.clone()
    draws = e.generator.get_state()
    done, seconds = capture_buckets(e.runner)
    assert done == len(reachable_buckets(e.runner)) > 3 and seconds >= 0     # (all within START_MAX_ROWS)
    assert e.runner.startup_capture == (done, seconds)
    assert all(inp.warmed for inp in e.runner.buckets.values())
    assert torch.equal(e.cache.key, key) and torch.equal(e.cache.value, value)
    assert torch.equal(e.generator.get_state(), draws)
    assert run(e) == plain


def test_capture_at_start_is_off_where_nothing_captures(pair):
    """On CPU the engine's own runner captures nothing, so `capture_at_start` (default True) warms nothing."""
    target, head = pair
    e = SpecEngine(target, head, LabConfig(), k=3, block_size=4, max_num_seqs=4)
    assert LabConfig().capture_at_start and not e.runner.capture_at_start
    e.add_request([1, 2, 3], 4)
    e.run()
    assert e.runner.startup_capture is None and not e.runner.buckets


def test_the_runner_captures_at_its_first_step(pair):
    """`capture_at_start` runs `capture_buckets` as the first step begins (here on a padded runner,
    eagerly), once; the run decodes what a runner that warmed nothing decodes."""
    plain = run(engine(pair, temperature=0.8))
    e = engine(pair, temperature=0.8)
    e.runner.capture_at_start = True
    assert e.runner.startup_capture is None
    assert run(e) == plain
    assert e.runner.startup_capture[0] == len(start_buckets(e.runner))


def _padded_run(target, head, cfg, warm: bool, prompts, **kw):
    e = SpecEngine(target, head, cfg, block_size=4, max_num_seqs=4, **kw)
    e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
    if warm:
        assert capture_buckets(e.runner)[0] > 0
    reqs = [e.add_request(p, 12) for p in prompts]
    e.run()
    return [r.output for r in reqs], e.runner.graphed_steps


def test_warm_up_on_padding_leaves_a_hybrid_targets_state_alone():
    """A hybrid target: its decode buckets only, padding on the store's scratch slot."""
    from nwor_lab.bench.state import toy_pair as hybrid_pair
    target, head = hybrid_pair()
    cfg = LabConfig(nwor_mode="stage", state_mode="stage")
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    plain = _padded_run(target, head, cfg, False, prompts, k=3)
    warmed = _padded_run(target, head, cfg, True, prompts, k=3)
    assert warmed == plain and plain[1] > 0


def test_warm_up_on_padding_leaves_the_prefix_cache_alone(pair):
    """Prefix caching: an all-padding step registers no block and keeps no boundary."""
    from nwor_lab.engine.prefix import PrefixCacheConfig
    target, head = pair
    shared = list(range(1, 13))
    prompts = [shared + [3], shared + [5, 6], shared + [7]]
    cfg = LabConfig(nwor_mode="stage")
    plain = _padded_run(target, head, cfg, False, prompts, k=3, prefix_cache=PrefixCacheConfig(), temperature=0.8, seed=2)
    warmed = _padded_run(target, head, cfg, True, prompts, k=3, prefix_cache=PrefixCacheConfig(), temperature=0.8, seed=2)
    assert warmed == plain and plain[1] > 0


def test_prefill_graphs_share_one_pool_and_write_outside_it(pair, monkeypatch):
    """Every prefill bucket's graph is captured into the runner's one prefill pool (largest first at
    start) and writes its outputs into tensors allocated at its warm-up, outside that pool (with the
    CPU graph stand-in: the wiring; the tokens under real shared pools are tests/gpu/'s)."""
    from graph_like import graph_like
    plain = run(engine(pair, temperature=0.8))
    graph_like(monkeypatch)
    pools = []
    import nwor_lab.engine.runner as runner_mod
    capture = runner_mod.capture_graph
    monkeypatch.setattr(runner_mod, "capture_graph", lambda fn, **kw: pools.append(kw["pool"]) or capture(fn, **kw))
    e = engine(pair, temperature=0.8)
    e.runner.capture = e.runner.capture_at_start = True
    prefill = [key.tokens for key in start_buckets(e.runner) if not key.max_query_len]
    assert prefill == sorted(prefill, reverse=True)
    assert run(e) == plain
    graphs = {key: inp for key, inp in e.runner.buckets.items() if inp.graph is not None}
    shared = {id(p) for key, p in zip(graphs, pools) if not key.max_query_len}
    assert len(shared) == 1 and e.runner.prefill_pool is not None
    assert all(p is None for key, p in zip(graphs, pools) if key.max_query_len)       # decode graphs: their own
    for key, inp in graphs.items():
        assert (inp.outputs is inp.kept) == (not key.max_query_len)
    # share_prefill_pool False (bench serve --own-graph-pools): every graph a pool of its own, as before
    pools.clear()
    e = engine(pair, temperature=0.8)
    e.runner.capture = e.runner.capture_at_start = True
    e.runner.share_prefill_pool = False
    assert run(e) == plain
    assert pools and all(p is None for p in pools) and e.runner.prefill_pool is None
