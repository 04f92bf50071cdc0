"""EAGLE-3 head: fused aux features, paged == dense, draft-vocabulary mapping."""
import pytest
import torch

from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model import AttentionMetadata
from nwor_lab.model.eagle3 import default_aux_layers
from nwor_lab.model.toy import toy_config, toy_eagle3, toy_pair


@pytest.fixture(scope="module")
def target():
    return toy_pair(0, cfg=toy_config(num_hidden_layers=4))[0]


def test_aux_features_paged_equal_dense(target):
    seq = torch.randint(0, 16, (7,), generator=torch.Generator().manual_seed(0))
    cache = PagedKVCache(KVCacheSpec(5, 8, 4, 2, 8))
    with torch.no_grad():
        hidden, aux = target.forward_dense(seq[None], aux_layers=(2, 2, 1))
        md = AttentionMetadata.build(cache, None, list(range(7)), [7], [[0, 1]], [0])
        h2, aux2 = target.forward_with_aux(seq, md, (2, 2, 1))
    assert aux.shape == (1, 7, 96)
    torch.testing.assert_close(aux2, aux[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h2, hidden[0], atol=1e-5, rtol=1e-5)
    assert default_aux_layers(32) == (2, 16, 29)


def test_eagle3_paged_equals_dense(target):
    head = toy_eagle3(target)
    seq = torch.randint(0, 16, (9,), generator=torch.Generator().manual_seed(1))
    cache = PagedKVCache(KVCacheSpec(5, 8, 4, 2, 8))
    with torch.no_grad():
        _, aux = target.forward_dense(seq[None], aux_layers=head.aux_layers)
        want = head.forward_dense(seq[None, 1:], aux[:, :-1])[0]
        md = AttentionMetadata.build(cache, None, list(range(8)), [8], [[0, 1]], [0])
        got = head(seq[1:], aux[0, :-1], md)
        # a chain step reads the head's own output g (width h, no fc)
        step = head.forward_dense(seq[None, 1:3], want[None, :2])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert step.shape == (1, 2, 32)
    assert cache.key[4].abs().sum() > 0 and cache.key[:4].abs().sum() == 0   # head layer = N


def test_draft_vocabulary_maps_to_target_ids(target):
    head = toy_eagle3(target, draft_vocab_size=8)        # draft id i -> target id 2i
    g = torch.randn(3, 32)
    logits = head.compute_logits(g)
    assert logits.shape == (3, 16)
    assert torch.isinf(logits[:, 1::2]).all() and torch.isfinite(logits[:, ::2]).all()
    torch.testing.assert_close(logits[:, ::2], head.lm_head(head.norm(g)))


def test_bad_aux_layers(target):
    with pytest.raises(ValueError, match="aux_layers"):
        toy_eagle3(target, aux_layers=(0, 1, 9))
