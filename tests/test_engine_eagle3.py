"""The engine with an EAGLE-3 head (random, reduced draft vocabulary): same tokens as target-only
in every NWOR mode, and the cache audit holds after every window."""
import pytest

from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.engine import generate
from nwor_lab.model.toy import toy_config, toy_eagle3, toy_pair
from test_engine import CacheAudit, prompts


@pytest.fixture(scope="module")
def pair3():
    target, _ = toy_pair(2, cfg=toy_config(num_hidden_layers=4))
    return target, toy_eagle3(target, seed=3, draft_vocab_size=12)


def run3(pair3, k=4, mode="off", scv="off", observers=(), **kw):
    target, head = pair3
    return generate(prompts(5), max_new_tokens=12, k=k, config=LabConfig(nwor_mode=mode, scv_mode=scv),
                    target=target, head=head, max_num_seqs=3, block_size=4, observers=observers, **kw)


@pytest.fixture(scope="module")
def target_only(pair3):
    return run3(pair3, k=0).token_ids


@pytest.mark.parametrize("mode", NWOR_MODES)
def test_eagle3_greedy_equals_target_only_and_cache_audit(pair3, target_only, mode):
    ref = target_only
    audit = CacheAudit()
    res = run3(pair3, mode=mode, scv="graph", observers=[audit])
    assert res.token_ids == ref
    assert audit.windows == len(res.trace) and any(w.kind == "draft" for w in res.trace)


def test_eagle3_stochastic_same_seed(pair3):
    outs = [run3(pair3, mode=m, temperature=1.0, seed=5).token_ids for m in NWOR_MODES]
    assert outs[0] == outs[1] == outs[2]
