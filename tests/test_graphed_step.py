"""The engine's graphed path for steady verify steps (nwor_lab.engine.graphed), run on CPU without
capture: the padded static step (buckets of 1, 2, 4 ... requests, padding rows, the head's inputs
and kept rows built on the device from the acceptance) decodes exactly what the eager engine does,
in every write policy, and so does the static draft chain (d_1..d_k from the head, the head's
layer only, every row rejected), in the verify step or alone, and so do steps pre-launched on the
inputs the step before computed on the device, and steps with prefills (alone, or mixed with decodes
when a request joins mid-run) on padded static buffers with the chain aboard. The CUDA capture itself
is tested in tests/gpu/test_gpu_engine.py."""
import pytest
import torch

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.graphed import GraphedVerify
from nwor_lab.model.toy import toy_pair

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14], [3, 3, 3]]


def decode(pair, mode, graphed: bool, k=3, mixed=True):
    target, head = pair
    engine = SpecEngine(target, head, LabConfig(nwor_mode=mode), k=k, block_size=4, max_num_seqs=4)
    if graphed:
        engine.graphed = GraphedVerify(engine, 4, 1024, capture=False)
        engine.graphed.mixed = mixed
    reqs = [engine.add_request(p, 14) for p in PROMPTS]
    engine.run()
    return [r.output for r in reqs], engine


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


@pytest.mark.parametrize("mode", NWOR_MODES)
@pytest.mark.parametrize("k", [0, 3])
def test_padded_static_step_decodes_what_the_eager_engine_does(pair, mode, k):
    eager, _ = decode(pair, mode, False, k)
    static, engine = decode(pair, mode, True, k)
    assert static == eager
    # the records the policies make after a replay are the ones their commits make eagerly
    eager_engine = decode(pair, mode, False, k)[1]
    recs = lambda e: [(t.kind, t.record.to_dict()) for t in e.trace]   # noqa: E731
    assert recs(engine) == recs(eager_engine)
    assert engine.graphed.steps > 0                       # the path was taken
    # steps launched before the host read the one before (inputs fed on the device)
    assert engine.graphed.prelaunched > 0
    assert engine.graphed.prefill_steps > 0               # prompts prefilled from their own buckets
    if k:                                                 # (without drafts all four end together)
        assert engine.graphed.mixed_steps > 0             # the 5th prompt joined three running requests
    sizes = {size for size, _ in engine.graphed.buckets}
    assert sizes <= {1, 2, 4}
    assert len(sizes) >= 2                                # padding exercised (5 requests, 4 at a time)
    if k >= 2:
        # the chain rode in every step: in the verify step, and after each prefill in the prefill's
        # own step (never a second graph)
        assert engine.graphed.chained_steps > 0 and (4, True) in engine.graphed.buckets
        assert all(chain for _, _, chain in engine.graphed.mixed_buckets)
        assert engine.graphed.draft.steps == 0


@pytest.mark.parametrize("mode", ["cow"])
def test_mixed_steps_left_eager_hand_the_chain_to_its_own_graph(pair, mode):
    """With mixed steps eager (GraphedVerify.mixed = False, the bench's comparison), the drafts
    after them come from the chain's own static path, and the tokens stay the eager engine's."""
    eager, _ = decode(pair, mode, False)
    static, engine = decode(pair, mode, True, mixed=False)
    assert static == eager
    assert engine.graphed.mixed_steps == 0 and engine.graphed.prefill_steps > 0
    assert engine.graphed.draft.steps > 0


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_a_request_ending_on_eos_inside_a_chained_step_ends_as_eagerly(pair, mode):
    """The chain rides in the verify step for every request of the bucket; one that emits the end
    token in that step finishes (its drafts are dropped) and the others decode on unchanged."""
    target, head = pair
    free, _ = decode(pair, mode, False)
    eos = free[1][4]                       # a token request 1 emits early, while chains ride along

    def run(graphed):
        engine = SpecEngine(target, head, LabConfig(nwor_mode=mode), k=3, block_size=4, max_num_seqs=4,
                            eos_token_id=eos)
        if graphed:
            engine.graphed = GraphedVerify(engine, 4, 1024, capture=False)
        reqs = [engine.add_request(p, 14) for p in PROMPTS]
        engine.run()
        return [r.output for r in reqs], engine

    (eager, _), (static, engine) = run(False), run(True)
    assert static == eager
    assert any(len(o) < 14 and o[-1] == eos for o in static)
    assert engine.graphed.chained_steps > 0


def test_a_request_added_while_a_step_is_pre_launched_joins_one_step_later(pair):
    """The pre-launched step is the engine's next step; a request queued meanwhile is admitted by
    the scheduler at the step after it, and everyone decodes what they decode alone."""
    target, head = pair
    engine = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=3, block_size=4, max_num_seqs=4)
    engine.graphed = GraphedVerify(engine, 4, 1024, capture=False)
    first = [engine.add_request(p, 14) for p in PROMPTS[:2]]
    while engine.graphed.pending is None:
        engine.step()
    late = engine.add_request(PROMPTS[2], 14)
    engine.step()                                     # takes up the pre-launched step
    assert late.num_computed == 0 and late in engine.scheduler.waiting
    engine.run()
    alone = []
    for p in PROMPTS[:3]:
        solo = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=3, block_size=4, max_num_seqs=4)
        r = solo.add_request(p, 14)
        solo.run()
        alone.append(r.output)
    assert [r.output for r in first + [late]] == alone


def test_an_interrupt_after_a_pre_launch_leaves_an_engine_that_says_so(pair, monkeypatch):
    """Ctrl-C between the pre-launch of the next step and this step's bookkeeping: the GPU went on,
    the host did not, so the engine refuses to step on (instead of decoding from a wrong state)."""
    from nwor_lab.engine import graphed as g
    target, head = pair
    engine = SpecEngine(target, head, LabConfig(nwor_mode="off"), k=3, block_size=4, max_num_seqs=4)
    engine.graphed = GraphedVerify(engine, 4, 1024, capture=False)
    [engine.add_request(p, 14) for p in PROMPTS[:2]]
    while engine.graphed.pending is None:
        engine.step()

    def interrupted(handle, n):
        raise KeyboardInterrupt

    monkeypatch.setattr(g.Readback, "rows", staticmethod(interrupted))
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="interrupted after the next one had been launched"):
        engine.step()


def staggered(pair, mode, graphed: bool, k: int, acceptance=None, gap: int = 2):
    """Requests joining a running batch every `gap` steps (the serving case): mixed steps."""
    target, head = pair
    engine = SpecEngine(target, head, LabConfig(nwor_mode=mode), k=k, block_size=4, max_num_seqs=4,
                        acceptance=acceptance)
    if graphed:
        engine.graphed = GraphedVerify(engine, 4, 1024, capture=False)
    queue, reqs, step = list(PROMPTS) * 2, [], 0
    while queue or engine.scheduler.has_work:
        if queue and step % gap == 0:
            reqs.append(engine.add_request(queue.pop(0), 9 + len(reqs) % 4))
        if engine.scheduler.has_work:
            engine.step()
        step += 1
    return [r.output for r in reqs], engine


@pytest.mark.parametrize("mode,k", [("off", 0), ("cow", 1), ("off", 3), ("cow", 3), ("stage", 3)])
def test_requests_joining_mid_run_replay_mixed_steps_as_the_eager_engine_decodes(pair, mode, k):
    """(A request that arrives while a step is pre-launched joins one step later than eagerly, so
    the windows group requests differently; each request's tokens are the same.)"""
    eager, _ = staggered(pair, mode, False, k)
    static, engine = staggered(pair, mode, True, k)
    assert static == eager
    assert engine.graphed.mixed_steps > 0
    if k >= 2:
        assert engine.graphed.draft.steps == 0     # every chain rode in a step's own graph


def test_forced_acceptance_mixed_steps_decode_as_eagerly(pair):
    from nwor_lab.speculative.synthetic import ForcedAcceptance
    forced = ForcedAcceptance((0.9, 0.6, 0.3))
    eager, eager_engine = staggered(pair, "stage", False, 3, forced)
    static, engine = staggered(pair, "stage", True, 3, forced)
    assert static == eager and engine.graphed.mixed_steps > 0

    def accepted(e):     # per request, its accepted lengths window by window
        out = {}
        for t in e.trace:
            if t.kind == "verify":
                for rid, a in zip(t.req_ids, t.accepted):
                    out.setdefault(rid, []).append(a)
        return out
    assert accepted(engine) == accepted(eager_engine)
