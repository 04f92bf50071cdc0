"""A hybrid target (gated DeltaNet + attention, nwor_lab.model.hybrid) through the engine's one step
body: its attention layers keep the paged K/V under the write policy, its linear-attention layers
their recurrent and conv states under the state strategy (`LabConfig.state_mode`). Greedy
speculative decoding with an EAGLE head equals target-only decoding under every strategy that keeps
only accepted rows in the state; `off` (the live state advanced through every draft) diverges."""

import pytest

from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.model.toy import toy_hybrid, toy_hybrid_head

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]


@pytest.fixture(scope="module")
def pair():
    target = toy_hybrid(2)
    return target, toy_hybrid_head(target, 3)


def decode(pair, k: int, state_mode: str, nwor_mode: str = "stage"):
    target, head = pair
    engine = SpecEngine(target, head if k else None, LabConfig(nwor_mode=nwor_mode, state_mode=state_mode), k=k,
                        block_size=4, max_num_seqs=2)
    reqs = [engine.add_request(p, 14) for p in PROMPTS]
    engine.run()
    drafted = sum(sum(t.drafted) for t in engine.trace if t.kind == "verify")
    accepted = sum(sum(t.accepted) for t in engine.trace if t.kind == "verify")
    return [r.output for r in reqs], drafted, accepted


@pytest.fixture(scope="module")
def target_only(pair):
    return decode(pair, 0, "auto", "off")[0]


@pytest.mark.parametrize("state_mode", ["snapshots", "cow", "replay", "stage"])
def test_every_strategy_that_keeps_accepted_rows_only_equals_target_only(pair, target_only, state_mode):
    out, drafted, accepted = decode(pair, 3, state_mode)
    assert out == target_only
    assert 0 < accepted < drafted          # drafts were both accepted and rejected


def test_off_advances_the_state_through_rejected_drafts_and_diverges(pair, target_only):
    out, drafted, accepted = decode(pair, 3, "off")
    assert accepted < drafted and out != target_only


@pytest.mark.parametrize("head", ["eagle1", "eagle3"])
def test_the_shipped_hybrid_pair_decodes_target_only_tokens_and_off_does_not(head):
    """The trained pair (nwor_lab/checkpoints/hybrid): its heads draft well enough that windows
    both accept and reject, `stage` keeps target-only's tokens, `off` does not."""
    from nwor_lab.model.shipped import load_hybrid
    target, draft, tok = load_hybrid(head=head)
    prompt = tok.encode("def main(args):\n    ").ids

    def run(k, state_mode):
        e = SpecEngine(target, draft if k else None, LabConfig(nwor_mode="stage", state_mode=state_mode), k=k,
                       block_size=16, max_num_seqs=1)
        r = e.add_request(prompt, 24)
        e.run()
        acc = [(sum(t.accepted), sum(t.drafted)) for t in e.trace if t.kind == "verify"]
        return r.output, sum(a for a, _ in acc), sum(d for _, d in acc)

    ref = run(0, "auto")[0]
    out, accepted, drafted = run(4, "stage")
    assert out == ref and 0 < accepted < drafted
    assert run(4, "off")[0] != ref
