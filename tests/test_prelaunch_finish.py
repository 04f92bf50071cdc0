"""A pre-launched step that carries requests which finished in the step before it (dead riders):
the device computed their `remaining` as 0 (`step.next_inputs`), so their rows write nothing
(`window_chain.verify_rows`: slot -1) and draft nothing; the host leaves them out of the step's
bookkeeping (`StepRunner.pending_requests`, `StepResult(aboard=)`). Run on CPU on the padded
eager path (`StepRunner(pad=True, capture=False)`), which runs the same body and pre-launches
like a graph does; the captured replay itself needs a GPU (tests/gpu/test_gpu_engine.py,
tests/gpu/test_gpu_sampling_graphs.py), unverified here.

Greedy tokens, every window's trace and every policy's record are the same with the pre-launch on
and off (nobody waits here, so both runs group the requests alike), for off / cow / stage, with
prefix caching (a second wave of prompts hits the blocks the first wave's finishing requests
left), with a `draft_counts` hook, and at k = 0; the cache bytes a dead rider's blocks hold do not
change while its step runs."""
import pytest
import torch

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.runner import StepRunner
from nwor_lab.model.toy import toy_pair

# different lengths and budgets, so requests finish at different steps while others run on
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 8], [9, 10, 1, 2, 3, 4, 5, 6], [11, 12, 13]]
MAX_NEW = [7, 12, 9, 16]


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


def engine_for(pair, mode, *, k=3, prelaunch=True, prefix="", temperature=0.0, hook=None):
    target, head = pair
    e = SpecEngine(target, head if k else None, LabConfig(nwor_mode=mode, prefix_cache=prefix), k=k, block_size=4,
                   max_num_seqs=4, num_blocks=128, temperature=temperature, seed=3)
    e.runner = StepRunner(e, 4, 1024, capture=False, pad=True)
    e.runner.prelaunch = prelaunch
    e.draft_counts = hook
    return e


def wave(e, prompts=PROMPTS):
    reqs = [e.add_request(p, n) for p, n in zip(prompts, MAX_NEW)]
    e.run()
    return [r.output for r in reqs]


def trace(e):
    return [(t.step, t.kind, t.req_ids, t.accepted, t.emitted, t.record.to_dict() if t.record else None)
            for t in e.trace]


def twice(pair, mode, waves=1, **kw):
    """-> (tokens, trace, engine) with the pre-launch on, then off."""
    out = []
    for prelaunch in (True, False):
        e = engine_for(pair, mode, prelaunch=prelaunch, **kw)
        tokens = [wave(e) for _ in range(waves)]
        out.append((tokens, trace(e), e))
    return out


@pytest.mark.parametrize("prefix", ["", "on"])
@pytest.mark.parametrize("mode", NWOR_MODES)
def test_finishing_requests_ride_dead_and_tokens_traces_records_stay(pair, mode, prefix):
    (on, on_trace, e), (off, off_trace, e_off) = twice(pair, mode, waves=2 if prefix else 1, prefix=prefix)
    assert e.runner.dead_riders > 0                     # the case was taken: a finished request rode a step
    assert e_off.runner.prelaunched == 0
    assert on == off
    assert on_trace == off_trace                        # the host skipped the dead riders everywhere
    if prefix:
        assert e.prefix_stats()["hit_tokens"] > 0       # the second wave read the first wave's blocks
        assert e.prefix_stats() == e_off.prefix_stats()


def test_greedy_tokens_are_target_only_tokens(pair):
    """(The dead riders' logits never reach a token: target-only greedy decoding agrees.)"""
    e = engine_for(pair, "stage")
    spec = wave(e)
    assert e.runner.dead_riders > 0
    assert spec == wave(engine_for(pair, "stage", k=0, prelaunch=False))


@pytest.mark.parametrize("counts", ["k", "cycling"])
def test_a_draft_counts_hook_decodes_alike(pair, counts):
    """A hook asked before each step (the pre-launch asks it with the requests that may finish)."""
    def make():
        if counts == "k":                               # keeps k: every decode step may pre-launch
            return lambda eng, reqs: [eng.k] * len(reqs)
        it = iter([3, 3, 3, 2, 3, 3, 1, 3, 3, 3] * 40)
        return lambda eng, reqs: [next(it)] * len(reqs)
    got = []
    for prelaunch in (True, False):
        e = engine_for(pair, "cow", prelaunch=prelaunch, hook=make())
        got.append(wave(e))
        if prelaunch:
            assert e.runner.prelaunched > 0 and (counts != "k" or e.runner.dead_riders > 0)
    assert got[0] == got[1] == wave(engine_for(pair, "cow", prelaunch=False))


def test_target_only_decode_buckets_ride_dead_too(pair):
    (on, on_trace, e), (off, off_trace, _) = twice(pair, "off", k=0)
    assert e.runner.dead_riders > 0 and on == off and on_trace == off_trace


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_a_dead_riders_blocks_are_not_written_while_its_step_runs(pair, mode):
    """Around every pre-launched launch (CPU: the body runs then), the cache slots whose bytes
    changed all lie in blocks of requests that run on; a request that finished in the step before
    (a dead rider) keeps every byte of its blocks and every row of its verify and chain windows has
    slot -1 (under stage and cow a rewrite of its t_last row would leave equal bytes: the slots are
    what shows it); no request holds more blocks than its worst case."""
    e = engine_for(pair, mode)
    r = e.runner
    launches = []
    orig = r._launch

    def spy(inp):
        if not getattr(spy, "pre", False):
            return orig(inp)
        key, value = e.cache.key.clone(), e.cache.value.clone()
        out = orig(inp)
        bs = e.cache.spec.block_size
        changed = ((e.cache.key != key) | (e.cache.value != value)).flatten(3).any(-1).any(0)   # [NB, BS]
        slots = set(torch.nonzero(changed.flatten()).flatten().tolist())
        blocks = {q.req_id: list(q.block_table.blocks) for q in spy.riders}
        # each window's slots by request slot (verify, then the chain's): a dead rider's must all be -1
        windows = [(w.slot_mapping.clone(), w.token_req.long().clone())
                   for w in (inp.window, inp.chain.window if inp.chain is not None else None) if w is not None]
        slot_of = {q.req_id: j for j, q in enumerate(spy.riders)}
        launches.append((e.step_index, blocks, {s // bs for s in slots}, windows, slot_of))
        return out

    orig_pre = r._prelaunch

    def pre(inp, riders):
        spy.pre, spy.riders = True, riders
        try:
            orig_pre(inp, riders)
        finally:
            spy.pre = False
        assert all(len(q.block_table.blocks) <= q.worst_case_blocks for q in riders)

    r._launch, r._prelaunch = spy, pre
    wave(e)
    assert r.dead_riders > 0
    last = {}
    for t in e.trace:
        if t.kind == "verify":
            for rid in t.req_ids:
                last[rid] = t.step
    dead_seen = 0
    for step, blocks, written, windows, slot_of in launches:
        # launched during step `step`, it runs as step + 1: riders whose last window was `step` ride dead
        dead = {rid for rid in blocks if last[rid] == step}
        live_blocks = {b for rid, bl in blocks.items() if rid not in dead for b in bl}
        assert written <= live_blocks, (step, written - live_blocks)
        for rid in dead:
            assert not written & set(blocks[rid]), (step, rid)
            for slots, token_req in windows:            # (stage and cow would rewrite equal bytes)
                mine = slots[token_req == slot_of[rid]]
                assert mine.numel() and bool((mine == -1).all()), (step, rid, mine)
        dead_seen += len(dead)
        if mode == "off":
            assert written                              # write-all: the live riders' rows landed (not vacuous)
    assert dead_seen == r.dead_riders


def test_refusals_that_remain_are_named(pair):
    """At T > 0 (the draws are laid out by request slot) and while a request waits for a seat, a
    request that may finish keeps the step for the host; the reason is one line."""
    e = engine_for(pair, "stage", temperature=0.8)
    wave(e)
    assert e.runner.dead_riders == 0 and e.runner.prelaunched > 0
    assert "T > 0" in e.runner.dead_rider_refusal()
    e = engine_for(pair, "stage")
    assert e.runner.dead_rider_refusal() is None
    e.add_request([1, 2], 3)
    assert "waits" in e.runner.dead_rider_refusal()
