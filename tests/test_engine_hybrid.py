"""A hybrid target (gated DeltaNet + attention, nwor_lab.model.hybrid) through the engine's one step
body: its attention layers keep the paged K/V under the write policy, its linear-attention layers
their recurrent and conv states under the state strategy (`LabConfig.state_mode`). Greedy
speculative decoding with an EAGLE head equals target-only decoding under every strategy that keeps
only accepted rows in the state; `off` (the live state advanced through every draft) diverges."""
import dataclasses

import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.eagle import EagleHead
from nwor_lab.model.toy import toy_hybrid

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]


@pytest.fixture(scope="module")
def pair():
    target = toy_hybrid(2)
    cfg = target.config
    fields = {f.name for f in dataclasses.fields(LlamaConfig)} - {"extra"}
    head_cfg = LlamaConfig(**{**{f: getattr(cfg, f) for f in fields}, "num_hidden_layers": 1})
    gen = torch.Generator().manual_seed(3)
    head = EagleHead(head_cfg, fc_bias=True)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 if p.dim() == 2 else
                    torch.ones_like(p) if "norm" in name else torch.zeros_like(p))
        h = cfg.hidden_size
        head.fc.weight.copy_(torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1))
    head.attach(target)
    return target, head.eval()


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
