"""Eager == bucketed, token for token and record for record, across the step's configurations:
every write policy and SCV mode x head (EAGLE-1, EAGLE-3) x ring strategy x forced acceptance x T > 0 with
seeds. "Bucketed" is the engine's runner with `pad` (on CPU: the bucket's padded buffers, the
device-side next inputs, pre-launch, no graph capture; the capture itself is tests/gpu); a step
that cannot be captured (T > 0, cow on a ring, ...) runs the same body eagerly in both. The lab
has no ngram drafter (vLLM's ngram runs in tests/vllm_plugin)."""
import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.runner import StepRunner
from nwor_lab.model.toy import toy_eagle3, toy_pair
from nwor_lab.speculative.synthetic import ForcedAcceptance

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14]]


@pytest.fixture(scope="module")
def heads():
    target, head = toy_pair(0)
    return target, {"eagle1": head, "eagle3": toy_eagle3(target, 0)}


def decode(target, head, cfg, padded: bool, **kw):
    engine = SpecEngine(target, head, cfg, k=3, block_size=4, max_num_seqs=3, **kw)
    if padded:
        engine.runner = StepRunner(engine, 3, 1024, capture=False, pad=True)
    reqs = [engine.add_request(p, 12) for p in PROMPTS]
    engine.run()
    recs = [(t.kind, t.accepted, t.record.to_dict() if t.record else None) for t in engine.trace]
    return [r.output for r in reqs], recs, engine


# every write policy and every SCV mode once, with each head (the policy and the mask are independent
# pieces of the step; tests/test_step_runner.py runs every policy bucketed with more requests)
CASES = [dict(nwor_mode=m, scv_mode=s) for m, s in zip(("off", "cow", "stage"), ("off", "graph", "adaptive"))]


@pytest.mark.parametrize("head_kind", ["eagle1", "eagle3"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['nwor_mode']}-{c['scv_mode']}")
def test_eager_equals_bucketed_greedy(heads, head_kind, case):
    target, hs = heads
    cfg = LabConfig(**case)
    eager = decode(target, hs[head_kind], cfg, False)
    padded = decode(target, hs[head_kind], cfg, True)
    assert padded[:2] == eager[:2]
    assert padded[2].runner.graphed_steps > 0


@pytest.mark.parametrize("mode,ring", [("off", "slack"), ("off", "guard"), ("cow", "ring"), ("stage", "ring")])
def test_eager_equals_bucketed_on_a_ring(heads, mode, ring):
    target, hs = heads
    cfg = LabConfig(nwor_mode=mode, kv_ring=ring, sliding_window=8, scv_mode="graph")
    eager = decode(target, hs["eagle1"], cfg, False)
    padded = decode(target, hs["eagle1"], cfg, True)
    assert padded[:2] == eager[:2]
    # cow on a ring reads evicted rows from its log: eager in both
    assert (padded[2].runner.graphed_steps > 0) == (mode != "cow")


def test_eager_equals_bucketed_with_forced_acceptance(heads):
    """(At T > 0 the bucketed step draws its noise over the bucket's padded shapes, so its seeded
    tokens are not the exact-size eager step's: tests/test_sampling_buckets.py checks that path.)"""
    target, hs = heads
    for kw in (dict(acceptance=ForcedAcceptance((0.9, 0.5, 0.2))),):
        tokens = []
        for m in ("off", "stage"):
            eager, padded = (decode(target, hs["eagle3"], LabConfig(nwor_mode=m, scv_mode="graph"), p, **kw)[:2]
                             for p in (False, True))
            assert padded == eager, (m, kw)           # tokens and records
            tokens.append(eager[0])
        assert tokens[0] == tokens[1], kw             # the same tokens in every policy
