"""The verify-step benchmark's step, run on CPU (the timing itself needs CUDA and is not tested):
each policy's step commits exactly the forced acceptance, and the cache rows it keeps agree
across policies."""
import torch

from nwor_lab.bench.step import StepCase
from nwor_lab.config import LabConfig
from nwor_lab.model.toy import toy_pair
from nwor_lab.policies import make_policy


@torch.no_grad()
def test_step_case_commits_the_forced_acceptance_in_every_mode():
    target, _ = toy_pair(0)
    kept = {}
    for mode in ("off", "cow", "stage"):
        case = StepCase(target, batch=3, k=4, context=9, attention="torch", seed=5)
        acceptance = case.forced(0.5)
        assert acceptance.accepted_len.tolist() == [2, 2, 2]
        before = case.cache.key.clone()
        # debug: the policy asserts committed == accepted for the forced acceptance
        policy = make_policy(LabConfig(nwor_mode=mode, debug=True), case.cache)
        case.step_fn(policy, acceptance)()
        slots = case.window.slot_mapping[acceptance.commit_mask]
        rejected = case.window.slot_mapping[~acceptance.commit_mask]
        flat = case.cache.key.view(case.cache.num_layers, -1, *case.cache.key.shape[-2:])
        kept[mode] = flat[:, slots].clone()
        if policy.preserves_rejected_slots:
            old = before.view_as(flat)
            assert torch.equal(flat[:, rejected], old[:, rejected])
    assert torch.equal(kept["off"], kept["stage"]) and torch.equal(kept["off"], kept["cow"])
    assert StepCase(target, batch=4, k=2, context=3, attention="torch").forced(0.2).accepted_len.tolist() == [1, 1, 0, 0]
