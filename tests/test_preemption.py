"""Preemption (recompute, swap) and abort in the engine (nwor_lab.engine.preemption), CPU, toy pair:

- a cache too small for the batch decodes by preempting, and every request's tokens equal the run
  with a big cache (and target-only's), greedy, under every write policy, with and without a head;
- swap copies a request's blocks (every layer) out and back bit for bit;
- T > 0 without per-request generators: the engine's one generator makes a preempted run draw in
  another order than an unpreempted one; what is exact is the same seed and schedule giving the same
  tokens under every write policy (seeded requests across preemption: tests/test_preemption_seeded.py);
- abort of a waiting or running request, between steps and at every phase of a verify window;
  after it every live request's committed K/V (target layers and the head's) is target-only's.
"""
import pytest
import torch

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.preemption import Preemption
from conftest import toy_engine
from test_engine import dense_kv

VOCAB = 16
SMALL, BIG = 12, 96        # blocks of 4 positions: the longest request needs 9 on its own


@pytest.fixture(scope="module")
def pair(toy_eagle1_pair):
    return toy_eagle1_pair


def prompts(n=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    lens = [3, 9, 1, 14, 6, 2, 11, 5][:n]
    return [torch.randint(0, VOCAB, (m,), generator=g).tolist() for m in lens]


def build(pair, *, mode="off", k=4, head=True, num_blocks=BIG, preemption=None, temperature=0.0, seed=0,
          max_new=14, n=6, observers=(), debug=True, **cfg):
    e = toy_engine(pair, k=k, head=head, mode=mode, observers=observers, debug=debug, cfg=cfg,
                   num_blocks=num_blocks, block_size=4, max_num_seqs=4, temperature=temperature, seed=seed,
                   preemption=preemption)
    reqs = [e.add_request(p, max_new) for p in prompts(n)]
    return e, reqs


def decode(pair, **kw):
    e, reqs = build(pair, **kw)
    e.run()
    assert e.scheduler.allocator.num_free == e.scheduler.allocator.num_blocks
    return e, [r.output for r in reqs]


@pytest.fixture(scope="module")
def reference(pair):
    return decode(pair, k=0)[1]


# every pair of (write policy, head or not, recompute or swap) once: 6 of the 12 combinations
@pytest.mark.parametrize("mode,head,how", [("off", True, "recompute"), ("off", False, "swap"),
                                           ("cow", True, "swap"), ("cow", False, "recompute"),
                                           ("stage", True, "swap"), ("stage", False, "recompute")])
def test_small_cache_preempts_and_decodes_the_big_cache_tokens(pair, reference, mode, head, how):
    _, big = decode(pair, mode=mode, head=head)
    e, small = decode(pair, mode=mode, head=head, num_blocks=SMALL, preemption=Preemption(how))
    stats = e.preemption_stats
    assert stats.preemptions > 0
    assert small == big == reference
    if how == "swap":
        assert stats.swapped_out_bytes > 0 and stats.swapped_in_bytes == stats.swapped_out_bytes
        assert stats.recomputed_tokens == 0
    else:
        assert stats.recomputed_tokens > 0 and stats.swapped_out_bytes == 0


def watch_swaps(e) -> list:
    """Checks every swap-in against what was swapped out: the request's committed K/V (every cache
    layer) and a hybrid target's committed state slot, bit for bit. -> per swap-in, whether it landed
    in other blocks."""
    saved, moved = {}, []
    out_hook, in_hook = e.scheduler.on_preempt, e.scheduler.on_resume

    def stores(r):
        slots = torch.tensor(r.block_table.slots(range(r.num_computed)))
        kv = [t for layer in range(e.cache.num_layers) for t in e.cache.gather(layer, slots)]
        state = [t.clone() for t in e.states.committed(r.state_slot)] if e.states is not None else []
        return kv + state

    def on_preempt(r):
        saved[r.req_id] = (r.num_computed, stores(r), list(r.block_table.blocks))
        out_hook(r)

    def on_resume(r):
        in_hook(r)
        n, before, blocks = saved.pop(r.req_id)
        assert r.num_computed == n
        assert all(torch.equal(a, b) for a, b in zip(before, stores(r)))
        moved.append(blocks != r.block_table.blocks)

    e.scheduler.on_preempt, e.scheduler.on_resume = on_preempt, on_resume
    return moved


def test_swap_copies_every_layer_back_bit_for_bit(pair, reference):
    e, reqs = build(pair, mode="stage", num_blocks=SMALL, preemption=Preemption("swap"))
    moved = watch_swaps(e)
    e.run()
    assert moved and any(moved), "a swapped-in request should land in other blocks"
    assert [r.output for r in reqs] == reference
    assert e.cache.num_layers == pair[0].num_layers + 1          # the head's layer was swapped too


def test_a_request_that_alone_cannot_fit_is_refused(pair):
    e, _ = build(pair, num_blocks=SMALL, n=0)
    with pytest.raises(ValueError, match="num_blocks"):
        e.add_request([1] * 30, 20)
    with pytest.raises(ValueError, match="Preemption"):
        Preemption("evict")
    with pytest.raises(TypeError, match="preemption"):
        SpecEngine(*pair, k=2, preemption="swap")


def test_seeded_sampling_under_preemption(pair):
    """One engine generator: preemption changes who is in a step, so the draws' order (and the
    tokens) differ from an unpreempted run. Exact: the same seed and schedule -> the same tokens,
    whatever the write policy."""
    kw = dict(num_blocks=SMALL, temperature=0.8, seed=5, preemption=Preemption("recompute"))
    runs = [decode(pair, mode=m, **kw) for m in NWOR_MODES]
    assert all(r[0].preemption_stats.preemptions > 0 for r in runs)
    assert all(r[1] == runs[0][1] for r in runs[1:])
    assert decode(pair, mode="stage", **{**kw, "seed": 6})[1] != runs[0][1]


def test_abort_waiting_and_running_between_steps(pair, reference):
    e, reqs = build(pair, mode="cow")
    e.step()
    e.step()
    running, waiting = e.scheduler.running[1], e.scheduler.waiting[0]
    got = list(running.output)
    assert got and not waiting.output
    assert e.abort(running.req_id) and e.abort(waiting.req_id)
    assert running.aborted and waiting.aborted and running.output == got and not running.block_table.blocks
    e.run()
    assert not e.abort(running.req_id)                           # already gone
    for r, ref in zip(reqs, reference):
        assert r.output == (ref[:len(r.output)] if r.aborted else ref)
    assert e.preemption_stats.aborted == 2
    assert e.scheduler.allocator.num_free == e.scheduler.allocator.num_blocks


class DropAt:
    """Aborts or preempts request `rid` in its first verify window with drafts from step `step` on, at
    `phase` (for `write`, once the window's first layer is written). When that is before the commit,
    checks at the commit that the request kept no draft: none accepted, and under a policy that
    preserves rejected slots every draft slot of it holds its bytes from before the window."""

    def __init__(self, engine, rid: int, phase: str, what: str, step: int):
        self.engine, self.rid, self.phase, self.what, self.step = engine, rid, phase, what, step
        self.done = self.checked = False
        self.before = self.open = None

    def on_phase(self, ev):
        e = self.engine
        if ev.kind != "verify":
            return
        if ev.phase == "begin":
            self.open = e.cache.snapshot()
        if self.done and ev.phase == "commit" and not self.checked and self.phase in ("begin", "write"):
            self.check_commit(ev)
        if self.done or ev.phase != self.phase or e.step_index < self.step:
            return
        self.index = next((j for j, r in enumerate(e.lifecycle.stepping()) if r.req_id == self.rid), None)
        if self.index is None:
            return
        r = e.lifecycle.stepping()[self.index]
        if not r.drafts:            # a prefill's window: wait for one with drafts
            return
        self.before = (r.num_computed, len(r.output), len(r.drafts))
        getattr(e, self.what)(self.rid)
        self.done = True

    def check_commit(self, ev):
        self.checked = True
        j, w = self.index, ev.window
        assert int(ev.acceptance.accepted_len[j]) == 0
        mine = (w.token_req.long() == j) & (w.token_draft_pos > 0) & (w.slot_mapping >= 0)
        assert int(mine.sum()) == self.before[2] > 0
        if ev.policy.preserves_rejected_slots:
            slots = w.slot_mapping[mine]
            bs = self.engine.cache.spec.block_size
            key, value = self.engine.cache.snapshot()
            for now, then in ((key, self.open[0]), (value, self.open[1])):
                assert torch.equal(now[:, slots // bs, slots % bs], then[:, slots // bs, slots % bs])


def check_live_stores(e):
    """Every running request's committed positions hold target-only's K/V (target layers and the head's)."""
    for r in e.scheduler.running:
        n = r.num_computed
        slots = torch.tensor(r.block_table.slots(range(n)))
        for layer, (k, v) in enumerate(dense_kv(e.target, e.head, r.tokens, n)):
            ck, cv = e.cache.gather(layer, slots)
            torch.testing.assert_close(ck, k, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cv, v, atol=1e-5, rtol=1e-5)


# every phase once, the phases checked at the commit (begin, write) under both policies that preserve
# rejected slots; an abort at write under every policy: test_the_auditor_under_preemption_and_abort
@pytest.mark.parametrize("mode,phase", [("cow", "begin"), ("stage", "begin"), ("stage", "write"),
                                        ("off", "acceptance"), ("cow", "commit")])
def test_abort_at_every_phase_of_a_verify_window(pair, reference, mode, phase):
    e, reqs = build(pair, mode=mode)
    drop = DropAt(e, rid=1, phase=phase, what="abort", step=3)
    e.observers.append(drop)
    while e.scheduler.has_work:
        e.step_with_progress()
        check_live_stores(e)
    r = reqs[1]
    assert drop.done and drop.checked == (phase in ("begin", "write")) and r.aborted and not r.block_table.blocks
    assert len(r.output) == drop.before[1]                   # the dropped window emitted nothing
    assert r.output == reference[1][:len(r.output)]
    assert [q.output for q in reqs if q is not r] == [x for i, x in enumerate(reference) if i != 1]
    assert e.preemption_stats.dropped_windows == 1
    assert e.scheduler.allocator.num_free == e.scheduler.allocator.num_blocks


# every (phase, recompute or swap) and every (write policy, recompute or swap) once: 6 of 18
@pytest.mark.parametrize("mode,phase,how", [("off", "begin", "recompute"), ("cow", "begin", "swap"),
                                            ("cow", "write", "recompute"), ("stage", "write", "swap"),
                                            ("stage", "acceptance", "recompute"), ("off", "acceptance", "swap")])
def test_preempt_mid_window_continues_with_the_same_tokens(pair, reference, mode, phase, how):
    e, reqs = build(pair, mode=mode, preemption=Preemption(how))
    drop = DropAt(e, rid=0, phase=phase, what="preempt", step=3)
    e.observers.append(drop)
    while e.scheduler.has_work:
        e.step_with_progress()
        check_live_stores(e)
    assert drop.done and drop.checked == (phase in ("begin", "write")) and reqs[0].preemptions == 1
    assert [r.output for r in reqs] == reference
    stats = e.preemption_stats
    assert stats.preemptions == stats.dropped_windows == 1
    assert (stats.swapped_out_bytes > 0) == (how == "swap")


# every write policy once, recompute and swap both
@pytest.mark.parametrize("mode,how", [("off", "recompute"), ("cow", "swap"), ("stage", "recompute")])
def test_draft_trees_preempt(pair, reference, mode, how):
    e, out = decode(pair, mode=mode, num_blocks=SMALL, preemption=Preemption(how), tree="topk=2,depth=3,nodes=6")
    assert e.preemption_stats.preemptions > 0 and out == reference


@pytest.mark.parametrize("mode", ["cow", "stage"])
def test_abort_mid_tree_window(pair, reference, mode):
    e, reqs = build(pair, mode=mode, tree="topk=2,depth=3,nodes=6")
    drop = DropAt(e, rid=1, phase="write", what="abort", step=3)
    e.observers.append(drop)
    while e.scheduler.has_work:
        e.step_with_progress()
        check_live_stores(e)
    assert drop.checked and reqs[1].aborted
    assert [q.output for q in reqs if q is not reqs[1]] == [x for i, x in enumerate(reference) if i != 1]


@pytest.fixture(scope="module")
def eagle3(toy_eagle3_pair):
    return toy_eagle3_pair


@pytest.mark.parametrize("how", ["recompute", "swap"])
def test_eagle3_preempts(eagle3, how):
    ref = decode(eagle3, k=0)[1]
    e, out = decode(eagle3, mode="stage", num_blocks=SMALL, preemption=Preemption(how))
    assert e.preemption_stats.preemptions > 0 and out == ref


# every write policy once (off: the check is caught), recompute and swap both
@pytest.mark.parametrize("mode,how", [("off", "swap"), ("cow", "recompute"), ("stage", "swap")])
def test_the_auditor_under_preemption_and_abort(pair, reference, mode, how):
    """`nwor-lab audit`'s checks (nwor_lab.audit) over a run that preempts and aborts mid-window:
    stage and cow leave no rejected row in any store, off is caught (the check is live)."""
    from nwor_lab.audit.run import prepare_audit
    target, head = pair
    audit = prepare_audit(LabConfig(nwor_mode=mode), prompts(), 14, target=target, head=head, k=4,
                          block_size=4, max_num_seqs=4, num_blocks=SMALL)
    e = audit.engine
    e.preemption = Preemption(how)
    drop = DropAt(e, rid=2, phase="write", what="abort", step=4)
    e.observers.append(drop)
    ref = [list(r) for r in reference]
    report = audit.run(reference=ref)
    aborted = audit.gen.requests[2]
    assert drop.checked and aborted.aborted and e.preemption_stats.preemptions > 0
    outs = [r.output for r in audit.gen.requests]
    assert outs[:2] + outs[3:] == ref[:2] + ref[3:] and outs[2] == ref[2][:len(outs[2])]
    reached = report.reached
    if mode == "off":
        assert "kv" in reached
    else:
        assert reached == [], reached


# -- a hybrid target (gated DeltaNet + attention): its recurrent and conv state slot goes with it --
@pytest.fixture(scope="module")
def hybrid(toy_hybrid_pair):
    return toy_hybrid_pair


@pytest.fixture(scope="module")
def hybrid_reference(hybrid):
    return decode(hybrid, k=0, state_mode="auto")[1]


# each state strategy and each way once; the other two pairs: test_prefix_hybrid.test_hits_beside_preemption
@pytest.mark.parametrize("state_mode,how", [("stage", "swap"), ("snapshots", "recompute")])
def test_hybrid_target_preempts(hybrid, hybrid_reference, state_mode, how):
    e, reqs = build(hybrid, mode="stage", state_mode=state_mode, num_blocks=SMALL, preemption=Preemption(how))
    moved = watch_swaps(e)
    e.run()
    assert e.preemption_stats.preemptions > 0
    assert [r.output for r in reqs] == hybrid_reference
    assert bool(moved) == (how == "swap")
    assert sorted(e.free_state_slots) == list(range(4))


# every phase, abort and preempt both; the rest of the 6: test_the_other_requests_stores_... (hybrid)
@pytest.mark.parametrize("phase,what", [("begin", "abort"), ("write", "preempt"), ("acceptance", "abort")])
def test_hybrid_drop_mid_window(hybrid, hybrid_reference, phase, what):
    """Dropped mid-window, a hybrid request's state slot went past t_last: it is freed (preempted:
    recomputed even under swap); the other requests' states decode target-only's tokens."""
    e, reqs = build(hybrid, mode="stage", state_mode="stage", preemption=Preemption("swap"))
    drop = DropAt(e, rid=1, phase=phase, what=what, step=3)
    e.observers.append(drop)
    e.run()
    r = reqs[1]
    assert drop.done and drop.checked == (phase in ("begin", "write"))
    assert e.preemption_stats.swapped_out_bytes == 0
    if what == "abort":
        assert r.aborted and r.output == hybrid_reference[1][:len(r.output)]
        assert [q.output for q in reqs if q is not r] == [x for i, x in enumerate(hybrid_reference) if i != 1]
    else:
        assert [q.output for q in reqs] == hybrid_reference
    assert sorted(e.free_state_slots) == list(range(4))


# the pre-launch fit is the scheduler's, not a policy's; stage runs it in test_drop_a_request_of_a_prelaunched_step
@pytest.mark.parametrize("mode", ["off", "cow"])
def test_padded_steps_and_prelaunch_under_preemption(pair, reference, mode):
    """Steps on bucket buffers (the captured path's inputs, eager on CPU; no CUDA graph here) with
    pre-launch: a pre-launched step's blocks must fit without preempting (`_prelaunch_fits`)."""
    from nwor_lab.engine.runner import StepRunner
    e, reqs = build(pair, mode=mode, num_blocks=SMALL, preemption=Preemption("swap"), debug=False)
    e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
    e.run()
    assert e.runner.graphed_steps > 0 and e.preemption_stats.preemptions > 0
    assert [r.output for r in reqs] == reference


# every write policy once, recompute (swapped for its budget) and swap both
@pytest.mark.parametrize("mode,how", [("off", "swap"), ("cow", "recompute"), ("stage", "recompute")])
def test_sliding_window_rings_preempt(pair, mode, how):
    """A ring holds at most ceil(S / BS) blocks; a request whose prompt + output outgrew its ring is
    swapped even under recompute (a re-prefill would overwrite its own ring positions)."""
    ref = decode(pair, k=0, mode=mode, sliding_window=16, max_new=24)[1]
    e, out = decode(pair, mode=mode, sliding_window=16, max_new=24, num_blocks=10, preemption=Preemption(how))
    assert e.preemption_stats.preemptions > 0 and out == ref
    e, reqs = build(pair, mode=mode, sliding_window=16, max_new=24, n=2, preemption=Preemption(how))
    while len(reqs[1].tokens) <= e.scheduler.ring_slots:
        e.step_with_progress()
    e.preempt(reqs[1].req_id)
    assert reqs[1].swapped is not None
    e.run()
    assert [r.output for r in reqs] == ref[:2]
    assert e.preemption_stats.swapped_for_budget == (how == "recompute")


@pytest.mark.parametrize("what", ["abort", "preempt"])
def test_drop_a_request_of_a_prelaunched_step(pair, what):
    """Between steps, a pre-launched step (bucket buffers, eager on CPU) already holds the request:
    the host drops it when it collects that step, and launches nothing more before."""
    from nwor_lab.engine.runner import StepRunner
    reference = decode(pair, k=0, n=3, max_new=24)[1]
    e, reqs = build(pair, mode="stage", n=3, debug=False, max_new=24, preemption=Preemption("swap"))
    e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
    while e.runner.pending is None:
        e.step_with_progress()
    victim = e.runner.pending_requests[1]
    got = len(victim.output)
    getattr(e, what)(victim.req_id)
    e.step_with_progress()
    assert len(victim.output) == got and e.runner.pending is None
    e.run()
    if what == "abort":
        assert victim.aborted
        assert [r.output for r in reqs if r is not victim] == [x for r, x in zip(reqs, reference) if r is not victim]
    else:
        assert victim.preemptions == 1 and [r.output for r in reqs] == reference


def live_stores(e) -> dict:
    """req_id -> (num_computed, output, its committed K/V of every layer and a hybrid state) of every
    running request, as copies."""
    out = {}
    for r in e.scheduler.running:
        slots = torch.tensor(r.block_table.slots(range(r.num_computed)))
        kv = [t for layer in range(e.cache.num_layers) for t in e.cache.gather(layer, slots)]
        state = [t.clone() for t in e.states.committed(r.state_slot)] if e.states is not None else []
        out[r.req_id] = (r.num_computed, list(r.output), kv + state)
    return out


# every (phase, abort or preempt) once, every write policy and the hybrid target at least once: 6 of 24
@pytest.mark.parametrize("model,mode,phase,what", [
    ("toy", "off", "begin", "abort"), ("toy", "cow", "begin", "preempt"), ("toy", "stage", "write", "abort"),
    ("hybrid", "stage", "write", "preempt"), ("toy", "cow", "acceptance", "abort"),
    ("hybrid", "stage", "acceptance", "preempt")])
def test_the_other_requests_stores_are_those_of_a_run_without_the_drop(pair, hybrid, model, mode, phase, what):
    """The step that drops a request mid-window runs the same batch as without the drop: every other
    request's committed K/V (every layer) and state equal that run's, bit for bit, after it."""
    kw = dict(mode=mode, preemption=Preemption("swap"))
    if model == "hybrid":
        kw["state_mode"] = "stage"
    m = pair if model == "toy" else hybrid
    a, _ = build(m, **kw)
    b, _ = build(m, **kw)
    drop = DropAt(a, rid=1, phase=phase, what=what, step=3)
    a.observers.append(drop)
    while not drop.done:
        a.step_with_progress()
        b.step_with_progress()
    got, want = live_stores(a), live_stores(b)
    assert 1 not in got and 1 in want and len(got) == len(want) - 1 >= 1
    for rid, (n, out, stores) in got.items():
        assert (n, out) == want[rid][:2]
        assert all(torch.equal(x, y) for x, y in zip(stores, want[rid][2]))


@pytest.mark.parametrize("cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_swap_an_fp8_cache(pair, cache_dtype):
    """Swap copies the stored bytes (fp8 here; the scales are per layer and stay)."""
    target, head = pair
    outs = []
    for num_blocks in (BIG, SMALL):
        e = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=4, num_blocks=num_blocks, block_size=4,
                       max_num_seqs=4, cache_dtype=cache_dtype, preemption=Preemption("swap"))
        reqs = [e.add_request(p, 14) for p in prompts()]
        moved = watch_swaps(e)
        e.run()
        outs.append([r.output for r in reqs])
    assert moved and outs[0] == outs[1]
