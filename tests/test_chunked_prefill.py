"""Chunked prefill (nwor_lab.engine.scheduler, `Request.chunk`), CPU, toy pairs: a prompt longer than
the step's token budget is prefilled in chunks beside the other requests' verify windows, and every
request decodes the tokens of an unchunked run:

- greedy: chunked == unchunked == target-only under every write policy, with an EAGLE-1 and an
  EAGLE-3 head, every committed position (the head's row at a chunk's end too) holding the dense K/V;
- T > 0: the engine has one generator, so a chunked run (more steps) draws in another order than an
  unchunked one; what is exact is the same seed and schedule giving the same tokens under every
  write policy;
- a prefix hit starts the chunks after the hit; preemption by recompute of a request whose
  prompt + output is over the budget re-prefills it in chunks (no swap); a hybrid target carries its
  recurrent and conv state across chunks; the bucket (captured path's) inputs, eager on CPU;
- the decoding requests keep decoding in the steps a long prompt is chunked in.
"""
import pytest
import torch

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.prefix import PrefixCacheConfig
from nwor_lab.engine.preemption import Preemption
from conftest import toy_engine
from test_engine import CacheAudit

BUDGET = 6          # tokens a step: the 23- and 14-token prompts are chunked


@pytest.fixture(scope="module")
def pair(toy_eagle1_pair):
    return toy_eagle1_pair


@pytest.fixture(scope="module")
def pair3(toy_eagle3_pair):
    return toy_eagle3_pair


def prompts(vocab=16, lens=(3, 23, 9, 14), seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def decode(pair, *, budget=1024, k=4, mode="stage", temperature=0.0, seed=0, num_blocks=96, max_new=12,
           observers=(), ps=None, cfg=None, setup=None, **kw):
    e = toy_engine(pair, k=k, mode=mode, debug=True, cfg=cfg, observers=observers, block_size=4,
                   num_blocks=num_blocks, max_num_seqs=4, max_num_batched_tokens=budget, temperature=temperature,
                   seed=seed, **kw)
    if setup is not None:
        setup(e)
    reqs = [e.add_request(p, max_new) for p in (ps or prompts())]
    e.run()
    assert e.scheduler.allocator.num_free == e.scheduler.allocator.num_blocks
    return [r.output for r in reqs], e


def chunks(e) -> int:
    """Rows of verify windows that were chunks not their prompt's last (prefill rows that emitted nothing)."""
    return sum(1 for w in e.trace if w.kind == "verify"
               for kind, out in zip(w.kinds, w.emitted) if kind == "prefill" and not out)


@pytest.fixture(scope="module")
def reference(pair):
    return decode(pair, k=0)[0]


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_chunked_equals_unchunked_greedy_in_every_write_policy(pair, reference, mode):
    audit = CacheAudit()
    unchunked, _ = decode(pair, mode=mode)
    chunked, e = decode(pair, mode=mode, budget=BUDGET, observers=[audit])
    assert chunked == unchunked == reference
    assert chunks(e) >= 5                         # 23 and 14 tokens over 6-token budgets
    assert audit.windows == len(e.trace)          # every committed row (a chunk end's head row too) is dense


def test_chunked_equals_unchunked_with_an_eagle3_head(pair3):
    ref, _ = decode(pair3, k=0)
    chunked, e = decode(pair3, budget=BUDGET, observers=[CacheAudit()])
    assert chunked == ref and chunks(e) > 0


def test_one_long_prompt_alone_drafts_as_unchunked(pair):
    """Alone in the batch, a chunked request's head cache is the unchunked one's: every decode window
    drafts and accepts the same (the head's row at each chunk's end read the prompt's next token)."""
    ps = [prompts()[1]]
    _, whole = decode(pair, ps=ps, max_new=16)
    _, cut = decode(pair, ps=ps, max_new=16, budget=5)
    spec = lambda e: [(w.drafted, w.accepted) for w in e.trace if w.kind == "verify" and "prefill" not in w.kinds]  # noqa: E731
    assert spec(cut) == spec(whole) and sum(a for _, acc in spec(whole) for a in acc) > 0
    assert chunks(cut) == 4                       # 23 tokens in 5-token chunks: 4 that sample nothing


def test_sampled_chunked_runs_agree_across_write_policies(pair):
    outs = [decode(pair, mode=m, budget=BUDGET, temperature=0.9, seed=5)[0] for m in NWOR_MODES]
    assert all(o == outs[0] for o in outs)
    assert outs[0] != decode(pair, budget=BUDGET, temperature=0.9, seed=6)[0]     # the seed matters


def test_decoding_requests_keep_decoding_while_a_long_prompt_is_chunked(pair):
    """The long prompt is admitted beside a running decode (no empty batch needed) and, in every step
    one of its chunks runs, the decode emits tokens too."""
    target, head = pair
    ps = prompts()[:2]
    ref, _ = decode(pair, k=0, ps=ps, max_new=30)
    e = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=4, block_size=4, num_blocks=96, max_num_seqs=4,
                   max_num_batched_tokens=8)
    short = e.add_request(ps[0], 30)
    e.step_with_progress()                        # the short prompt's prefill: it decodes from now on
    long = e.add_request(ps[1], 30)
    steps = 0
    while long.is_prefill:
        e.step_with_progress()
        w = next(w for w in reversed(e.trace) if w.kind == "verify")
        assert w.req_ids == [short.req_id, long.req_id] and w.kinds[1] == "prefill"
        assert w.emitted[0], "the decode stalled in a chunk's step"
        steps += 1
    assert steps >= 5                              # 23 tokens, at most 7 a step beside t_last + drafts
    e.run()
    assert [short.output, long.output] == ref


def test_a_prefix_hit_starts_the_chunks_after_the_hit(pair):
    """The second request shares 5 blocks (20 tokens) with the first: it is matched at admission and
    prefills only its tail, in chunks."""
    target, head = pair
    ps = prompts(lens=(22, 11))
    ps[1] = ps[0][:20] + ps[1]
    ref, _ = decode(pair, k=0, ps=ps)
    e = SpecEngine(target, head, LabConfig(nwor_mode="stage", debug=True), k=4, block_size=4, num_blocks=96,
                   max_num_seqs=1, max_num_batched_tokens=4, prefix_cache=PrefixCacheConfig())
    starts = []
    admit = e.scheduler.on_admit
    e.scheduler.on_admit = lambda r: (admit(r), starts.append(r.num_computed))
    e.observers.append(CacheAudit())
    reqs = [e.add_request(p, 12) for p in ps]
    e.run()
    assert [r.output for r in reqs] == ref
    assert starts[1] >= 16 and e.prefix_stats()["hit_tokens"] == starts[1]
    assert chunks(e) >= (22 - 1) // 4 + (len(ps[1]) - starts[1] - 1) // 4


# re-chunking is the scheduler's; every write policy under preemption by recompute:
# test_preemption.test_small_cache_preempts_and_decodes_the_big_cache_tokens
@pytest.mark.parametrize("mode", ["stage"])
def test_recompute_of_a_request_over_the_budget_rechunks(pair, reference, mode):
    """A cache too small for the batch preempts by recompute; a request whose prompt + output is over
    the budget is re-prefilled in chunks (it used to be swapped instead)."""
    seen = []

    def watch(e):
        hook = e.scheduler.on_preempt
        e.scheduler.on_preempt = lambda r: (seen.append((len(r.prompt), len(r.output))), hook(r))

    out, e = decode(pair, mode=mode, budget=4, num_blocks=10, preemption=Preemption("recompute"), setup=watch)
    stats = e.preemption_stats
    assert out == reference
    assert stats.preemptions > 0 and stats.swapped_for_budget == 0 and stats.swapped_out_bytes == 0
    assert any(n > 0 and p + n > 4 for p, n in seen)       # prompt + output over the budget, re-prefilled
    assert stats.recomputed_tokens == sum(p + n for p, n in seen)


# resuming chunks is the scheduler's; every write policy under swap: test_preemption's small-cache cases
@pytest.mark.parametrize("mode", ["cow"])
def test_a_request_swapped_between_its_chunks_resumes_them(pair, reference, mode):
    seen = []

    def watch(e):
        hook = e.scheduler.on_preempt
        e.scheduler.on_preempt = lambda r: (seen.append((r.is_prefill, r.num_computed)), hook(r))

    out, e = decode(pair, mode=mode, budget=3, num_blocks=11, preemption=Preemption("swap"), setup=watch)
    stats = e.preemption_stats
    assert out == reference and stats.recomputed_tokens == 0
    assert any(prefill and n > 0 for prefill, n in seen)        # preempted with part of its prompt computed
    assert stats.swapped_in_bytes == stats.swapped_out_bytes > 0


@pytest.mark.parametrize("state_mode", ["snapshots", "cow", "replay", "stage"])
def test_a_hybrid_target_carries_its_state_across_chunks(toy_hybrid_pair, state_mode):
    """Gated DeltaNet + attention: each chunk starts from the state the previous chunk committed.
    Prompts stay within the recurrence's token-by-token form (16 rows), so the chunked and whole
    prefills run the same arithmetic."""
    target, head = toy_hybrid_pair
    ps = prompts(vocab=32, lens=(4, 15, 11))

    def run(k, budget, mode="stage", state="auto"):
        e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=mode, state_mode=state), k=k,
                       block_size=4, max_num_seqs=2, max_num_batched_tokens=budget)
        reqs = [e.add_request(p, 10) for p in ps]
        e.run()
        return [r.output for r in reqs], e

    ref, _ = run(0, 1024, "off")
    out, e = run(3, 5, state=state_mode)
    assert out == ref and chunks(e) >= 3


def test_bucket_inputs_carry_chunks(pair, reference):
    """Steps on bucket buffers (the captured path's inputs: `chunk_next` a device buffer), eager on
    CPU; no CUDA graph is captured here (no GPU)."""
    from nwor_lab.engine.runner import StepRunner
    target, head = pair
    e = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=4, block_size=4, num_blocks=96, max_num_seqs=4,
                   max_num_batched_tokens=BUDGET)
    e.runner = StepRunner(e, 4, BUDGET, capture=False, pad=True)
    reqs = [e.add_request(p, 12) for p in prompts()]
    e.run()
    assert e.runner.graphed_steps > 0 and e.runner.mixed_steps > 0 and chunks(e) > 0
    assert [r.output for r in reqs] == reference


def test_tree_windows_after_chunked_prefills(pair):
    """Draft trees: a step with prefills runs the prefills alone (the engine's rule), chunks included."""
    ref, _ = decode(pair, k=0)
    out, e = decode(pair, budget=8, cfg=dict(tree="topk=2,depth=2,nodes=4"))
    assert out == ref and chunks(e) > 0


class DropChunk:
    """Preempts or aborts request `rid` while one of its chunks (not the last) is open, at `phase`."""

    def __init__(self, engine, rid: int, phase: str, what: str):
        self.engine, self.rid, self.phase, self.what, self.done = engine, rid, phase, what, False

    def on_phase(self, ev):
        e = self.engine
        if self.done or ev.kind != "verify" or ev.phase != self.phase:
            return
        r = next((r for r in e.lifecycle.stepping() if r.req_id == self.rid), None)
        if r is not None and r.num_computed > 0 and r.chunk_next() >= 0:
            self.done = True
            (e.preempt if self.what == "preempt" else e.abort)(self.rid)


@pytest.mark.parametrize("what", ["preempt", "abort"])
@pytest.mark.parametrize("phase", ["begin", "commit"])
def test_a_chunk_dropped_while_its_window_is_open(pair, reference, what, phase):
    """Preempted (recompute) or aborted mid-chunk, before or at the commit: the others decode their
    tokens, a preempted request re-prefills and decodes its own, an aborted one emitted nothing."""
    drop = []
    out, e = decode(pair, budget=BUDGET, preemption=Preemption("recompute"),
                    setup=lambda e: (drop.append(DropChunk(e, 1, phase, what)), e.observers.append(drop[0])))
    assert drop[0].done
    if what == "preempt":
        assert out == reference and e.preemption_stats.dropped_windows == 1
    else:
        assert out[1] == [] and out[:1] + out[2:] == reference[:1] + reference[2:]


def test_generate_takes_prefix_caching_and_preemption(pair):
    """`generate(..., prefix_cache=, preemption=)` (engine keywords): `summary()` reports both; a long
    prompt is chunked under a small budget; a wrong type is refused before anything is built."""
    from nwor_lab.engine import generate
    target, head = pair
    ps = prompts(lens=(22, 3))
    ps[1] = ps[0][:16] + ps[1]
    kw = dict(target=target, head=head, k=4, block_size=4, max_num_seqs=1, max_num_batched_tokens=5)
    plain = generate(ps, 8, **kw).summary()
    assert plain["prefix_cache"] is None and plain["preemption"]["mode"] == "recompute"
    res = generate(ps, 8, **kw, prefix_cache=PrefixCacheConfig(lookahead="drop_last"), preemption=Preemption("swap"))
    s = res.summary()
    assert s["prefix_cache"]["hit_tokens"] > 0 and s["prefix_cache"]["lookahead"] == "drop_last"
    assert s["preemption"]["mode"] == "swap" and res.token_ids == generate(ps, 8, **{**kw, "k": 0}).token_ids
    with pytest.raises(TypeError, match="prefix_cache: expected a PrefixCacheConfig"):
        generate(ps, 8, **kw, prefix_cache="cached")
    with pytest.raises(TypeError, match="preemption: expected"):
        generate(ps, 8, **kw, preemption="swap")
