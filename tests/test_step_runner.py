"""The engine's one step body on padded bucket buffers (nwor_lab.engine.runner with `pad`), run on
CPU without capture: the padded step (buckets of 1, 2, 4 ... requests, padding rows, the head's
inputs and kept rows built on the device from the acceptance, the draft chain aboard) decodes
exactly what the same body decodes on exact-size buffers, in every write policy, and so do steps
pre-launched on the inputs the step before computed on the device, and steps with prefills (alone,
or mixed with decodes when a request joins mid-run). The CUDA capture itself is tested in
tests/gpu/test_gpu_engine.py."""
import pytest
import torch

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.runner import StepRunner
from nwor_lab.model.toy import toy_pair

def padded(engine, size: int = 4, tokens: int = 1024) -> StepRunner:
    """The engine's runner, steps that could be captured on their bucket's padded buffers."""
    engine.runner = StepRunner(engine, size, tokens, capture=False, pad=True)
    return engine.runner


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14], [3, 3, 3]]


def decode(pair, mode, graphed: bool, k=3, mixed=True):
    target, head = pair
    engine = SpecEngine(target, head, LabConfig(nwor_mode=mode), k=k, block_size=4, max_num_seqs=4)
    if graphed:
        padded(engine).mixed = mixed
    reqs = [engine.add_request(p, 14) for p in PROMPTS]
    engine.run()
    return [r.output for r in reqs], engine


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


@pytest.mark.parametrize("mode", NWOR_MODES)
@pytest.mark.parametrize("k", [0, 3])
def test_padded_static_step_decodes_what_the_eager_engine_does(pair, mode, k):
    eager, eager_engine = decode(pair, mode, False, k)
    static, engine = decode(pair, mode, True, k)
    assert static == eager
    # the records the policies make after a replay are the ones their commits make eagerly
    recs = lambda e: [(t.kind, t.record.to_dict()) for t in e.trace]   # noqa: E731
    assert recs(engine) == recs(eager_engine)
    r = engine.runner
    assert r.graphed_steps > 0                            # the path was taken
    # steps launched before the host read the one before (inputs fed on the device)
    assert r.prelaunched > 0
    assert r.prefill_steps > 0                            # prompts prefilled from their own buckets
    if k:                                                 # (without drafts all four end together)
        assert r.mixed_steps > 0                          # the 5th prompt joined three running requests
    sizes = {key[0] for key in r.buckets}
    assert sizes <= {1, 2, 4}
    assert len(sizes) >= 2                                # padding exercised (5 requests, 4 at a time)
    # the chain rides in every bucket's step (after a prefill, in the prefill's own step)
    assert all(inp.chain is not None for inp in r.buckets.values()) == bool(k)


@pytest.mark.parametrize("mode", ["cow"])
def test_mixed_steps_left_eager_decode_the_same(pair, mode):
    """With mixed steps eager (StepRunner.mixed = False, the bench's comparison) the same body runs
    them on exact-size buffers, and the tokens stay the same."""
    eager, _ = decode(pair, mode, False)
    static, engine = decode(pair, mode, True, mixed=False)
    assert static == eager
    assert engine.runner.mixed_steps == 0 and engine.runner.prefill_steps > 0


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
            padded(engine)
        reqs = [engine.add_request(p, 14) for p in PROMPTS]
        engine.run()
        return [r.output for r in reqs], engine

    (eager, _), (static, engine) = run(False), run(True)
    assert static == eager
    assert any(len(o) < 14 and o[-1] == eos for o in static)
    assert engine.runner.graphed_steps > 0


def test_a_request_added_while_a_step_is_pre_launched_joins_one_step_later(pair):
    """The pre-launched step is the engine's next step; a request queued meanwhile is admitted by
    the scheduler at the step after it, and everyone decodes what they decode alone."""
    target, head = pair
    engine = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=3, block_size=4, max_num_seqs=4)
    padded(engine)
    first = [engine.add_request(p, 14) for p in PROMPTS[:2]]
    while engine.runner.pending is None:
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
    from nwor_lab.engine import buffers as g
    target, head = pair
    engine = SpecEngine(target, head, LabConfig(nwor_mode="off"), k=3, block_size=4, max_num_seqs=4)
    padded(engine)
    [engine.add_request(p, 14) for p in PROMPTS[:2]]
    while engine.runner.pending is None:
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
        padded(engine)
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
    assert engine.runner.mixed_steps > 0


def test_forced_acceptance_mixed_steps_decode_as_eagerly(pair):
    from nwor_lab.speculative.synthetic import ForcedAcceptance
    forced = ForcedAcceptance((0.9, 0.6, 0.3))
    eager, eager_engine = staggered(pair, "stage", False, 3, forced)
    static, engine = staggered(pair, "stage", True, 3, forced)
    assert static == eager and engine.runner.mixed_steps > 0

    def accepted(e):     # per request, its accepted lengths window by window
        out = {}
        for t in e.trace:
            if t.kind == "verify":
                for rid, a in zip(t.req_ids, t.accepted):
                    out.setdefault(rid, []).append(a)
        return out
    assert accepted(engine) == accepted(eager_engine)


def test_the_runner_and_eager_reason_read_one_table_of_eager_rules(pair):
    """`StepRunner.never_static` holds exactly when `eager_reason` names a rule (one table,
    `engine.eager_rules.EAGER_RULES`), for every rule a CPU engine can show."""
    from nwor_lab.engine.engine import eager_reason
    from nwor_lab.engine.eager_rules import EAGER_RULES
    target, head = pair
    cases = {None: LabConfig(), "scv_mode='off'": LabConfig(scv_mode="off"), "debug=True": LabConfig(debug=True),
             "static tree": LabConfig(tree="paths=0|1|0.0|1.0"), "observers": LabConfig()}
    for words, cfg in cases.items():
        e = SpecEngine(target, head, cfg, k=2, block_size=4, max_num_seqs=4)
        if words == "observers":
            e.observers.append(object())
        runner = StepRunner(e, 4, 64, capture=True, pad=True)
        e.runner = runner
        reason = eager_reason(e)
        assert runner.never_static() == (reason is not None), (words, reason)
        assert (reason is None) if words is None else words in reason
    assert len(EAGER_RULES) >= 6
