"""Forced acceptance (vLLM's synthetic mode, nwor_lab.speculative.synthetic): the profile's rules,
the hashed uniforms, the sampler against a host loop written from vLLM's kernel, and the engine
accepting what the profile says, eagerly and in its graphed steps (run without capture)."""
import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.generate import acceptance_stats
from nwor_lab.model.toy import toy_pair
from nwor_lab.speculative import SpecDecodeMetadata, rejection_sample
from nwor_lab.speculative.synthetic import (SHIPPED_PROFILE, ForcedAcceptance, check_profile, conditional_rates,
                                            constant_profile, hashed_uniforms, mean_acceptance_length)


def test_profile_rules_follow_vllm():
    assert conditional_rates([0.8, 0.4, 0.0, 0.0]) == [0.8, 0.5, 0.0, 0.0]     # c_j = p_j / p_{j-1}, 0 after 0
    assert check_profile([0.9, 0.5, 0.2], k=2) == (0.9, 0.5)
    with pytest.raises(ValueError, match="must not increase"):
        check_profile([0.5, 0.6])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        check_profile([1.2])
    with pytest.raises(ValueError, match="k = 4 drafts need 4"):
        check_profile([0.9, 0.5], k=4)
    assert constant_profile(0.5, 3) == (0.5, 0.25, 0.125)
    assert mean_acceptance_length(SHIPPED_PROFILE[:4]) == pytest.approx(3.345)


def test_parse_forms():
    assert ForcedAcceptance.parse("shipped", 4).profile == SHIPPED_PROFILE
    assert ForcedAcceptance.parse("0.5", 3).profile == (0.5, 0.25, 0.125)
    assert ForcedAcceptance.parse("0.9,0.7,0.5", 3).for_k(2) == (0.9, 0.7)
    with pytest.raises(ValueError, match="expected 'shipped'"):
        ForcedAcceptance.parse("lots", 2)
    d = ForcedAcceptance((0.8, 0.4)).describe(2)
    assert d["conditional"] == [0.8, 0.5] and d["expected_mean_acceptance_length"] == 2.2


def test_hashed_uniforms_are_deterministic_uniform_and_independent_across_positions():
    keys = torch.arange(200).repeat_interleave(50)
    pos = torch.arange(50).repeat(200) + 1000
    u = hashed_uniforms(keys, pos, seed=3)
    assert torch.equal(u, hashed_uniforms(keys, pos, seed=3)) and u.dtype == torch.float64
    assert not torch.equal(u, hashed_uniforms(keys, pos, seed=4))
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    grid = u.view(200, 50)
    corr = torch.corrcoef(torch.stack([grid[:, :-1].reshape(-1), grid[:, 1:].reshape(-1)]))[0, 1]
    assert abs(float(corr)) < 0.03                       # neighbouring drafts are not correlated


def host_loop(drafts, cu, argmax, bonus, u, cond):
    """vLLM's rejection_greedy_sample_kernel in synthetic mode, written out per request."""
    out, start = [], 0
    for r, end in enumerate(cu):
        row, rejected = [], False
        for j in range(end - start):
            d = drafts[start + j]
            accepted = u[start + j] < cond[j] and d >= 0
            row.append(d if accepted else argmax[start + j])
            if not accepted:
                rejected = True
                break
        if not rejected:
            row.append(bonus[r])
        out.append(row + [-1] * (max(b - a for a, b in zip([0] + cu[:-1], cu)) + 1 - len(row)))
        start = end
    return out


def test_sampler_in_synthetic_mode_is_vllms_kernel():
    gen = torch.Generator().manual_seed(0)
    counts = [3, 0, 2, 3, 1]
    cu_sched = torch.tensor([n + 1 for n in counts]).cumsum(0).tolist()
    drafts = torch.randint(0, 50, (sum(counts),), generator=gen)
    drafts[4] = -1                                        # a padding draft: always rejected
    md = SpecDecodeMetadata.build(counts, cu_sched, drafts)
    logits = torch.randn(sum(counts) + len(counts), 50, generator=gen)
    u = torch.rand(sum(counts), generator=gen, dtype=torch.float64)
    cond = torch.tensor([0.9, 0.6, 0.3], dtype=torch.float64)
    got = rejection_sample(md, None, logits, synthetic_rates=cond, uniform_probs=u)
    rows = logits[md.target_logits_indices.long()].argmax(-1).tolist()
    bonus = logits[md.bonus_logits_indices.long()].argmax(-1).tolist()
    cu = torch.tensor(counts).cumsum(0).tolist()
    assert got.tolist() == host_loop(drafts.tolist(), cu, rows, bonus, u.tolist(), cond.tolist())
    with pytest.raises(ValueError, match="needs uniform_probs"):
        rejection_sample(md, None, logits, synthetic_rates=cond)


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


@pytest.mark.parametrize("profile,expect", [((1.0, 1.0, 1.0), 3), ((0.0, 0.0, 0.0), 0)])
def test_engine_accepts_what_the_profile_says(pair, profile, expect):
    target, head = pair
    engine = SpecEngine(target, head, LabConfig(nwor_mode="cow", debug=True), k=3, block_size=4,
                        acceptance=ForcedAcceptance(profile))
    reqs = [engine.add_request([1, 2, 3], 20), engine.add_request([4, 5], 20)]
    engine.run()
    accepted = [a for t in engine.trace if t.kind == "verify" for a, n in zip(t.accepted, t.drafted) if n]
    assert accepted and set(accepted) == {expect}
    assert all(len(r.output) == 20 for r in reqs)


def test_engine_acceptance_follows_the_shipped_profile(pair):
    target, head = pair
    forced = ForcedAcceptance()
    engine = SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=4, block_size=4, max_num_seqs=8,
                        acceptance=forced)
    for i in range(8):
        engine.add_request([1 + i, 2, 3], 50)
    engine.run()
    mean, by_pos = acceptance_stats(engine.trace, 4)          # ~120 windows
    assert mean == pytest.approx(mean_acceptance_length(forced.for_k(4)), abs=0.35)
    assert by_pos == pytest.approx(list(forced.for_k(4)), abs=0.12)
