"""The step benchmark's step, run on CPU (the timing itself needs CUDA and is not tested): it is the
engine's own body on the engine's exact-size buffers, it repeats the same step from its saved
inputs, and every policy reaches the same verdicts and next drafts on the same prompts."""
import torch

from nwor_lab.bench.step import StepCase
from nwor_lab.model.toy import toy_pair


@torch.no_grad()
def test_step_case_repeats_the_engines_step_alike_in_every_mode():
    pair = toy_pair(0)
    outs = {}
    for mode in ("none", "off", "cow", "stage"):
        case = StepCase(pair, batch=3, k=4, context=9, mode=mode, rate=0.5, attention="torch", graphs=False)
        assert case.inputs is None                      # no CUDA: no captured bucket
        first, second = case.eager()[0].clone(), case.eager()[0].clone()
        assert torch.equal(first, second)               # the same step, from the same inputs
        assert first.shape == (3, 2 * 4 + 2)            # sampled ids, accepted length, next drafts
        outs[mode] = first
    # the verdicts (forced acceptance) and the drafts do not depend on the write policy
    assert all(torch.equal(o[:, :6], outs["off"][:, :6]) for o in outs.values() if o is not outs["none"])
    assert torch.equal(outs["off"], outs["stage"]) and torch.equal(outs["off"], outs["cow"])
