"""Zero-copy staging: in `stage` mode the model projects K/V straight into the staging buffer.

- every write of a real engine run (target layers, the head's layer, the draft chain) finds its
  rows already in the buffer: no copy is issued;
- projecting into a destination gives bit-identical K/V to projecting into fresh memory (so
  every mode computes the same numbers);
- K/V from elsewhere (not the buffer) are still copied in.
"""
import torch

from nwor_lab.config import LabConfig
from nwor_lab.engine import generate
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.llama import LlamaAttention, _linear
from nwor_lab.model.rope import Rotary
from nwor_lab.model.toy import toy_pair
from nwor_lab.policies import make_policy
from nwor_lab.policies.stage import StagePolicy
from nwor_lab.window import Acceptance, Window


def test_engine_stage_writes_are_all_in_place(monkeypatch):
    seen = []
    real = StagePolicy._in_place

    def spy(self, layer, key, value, token_offset):
        hit = real(self, layer, key, value, token_offset)
        seen.append((self.kind, layer, hit))
        return hit

    monkeypatch.setattr(StagePolicy, "_in_place", spy)
    target, head = toy_pair(0)
    out = generate([[1, 2, 3], [4, 5, 6, 7, 8]], k=3, max_new_tokens=8, block_size=4,
                   config=LabConfig(nwor_mode="stage", debug=True), target=target, head=head)
    ref = generate([[1, 2, 3], [4, 5, 6, 7, 8]], k=3, max_new_tokens=8, block_size=4,
                   config=LabConfig(nwor_mode="off"), target=target, head=head)
    assert out.token_ids == ref.token_ids
    kinds = {k for k, _, _ in seen}
    assert {"verify", "draft"} <= kinds                      # both window kinds went through it
    head_layer = target.num_layers
    assert any(layer == head_layer for _, layer, _ in seen)  # the head's layer too
    assert all(hit for _, _, hit in seen), [s for s in seen if not s[2]]


@torch.no_grad()
def test_projection_into_destination_is_bit_identical():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    for bias in (False, True):
        attn = LlamaAttention(cfg.__class__(**{**cfg.__dict__, "attention_bias": bias}))
        x = torch.randn(5, 64)
        rot = Rotary(cfg.head_dim, cfg.rope_theta)
        cos, sin = rot.cos_sin(torch.arange(5), x.dtype)
        k_fresh = Rotary.rotate(attn.k_proj(x).view(5, 2, -1), cos, sin)
        k_dest = torch.full((5, 2, cfg.head_dim), float("nan"))
        Rotary.rotate(attn.k_proj(x).view(5, 2, -1), cos, sin, out=k_dest)
        assert torch.equal(k_fresh, k_dest)
        v_dest = torch.full((5, 2 * cfg.head_dim), float("nan"))
        _linear(attn.v_proj, x, v_dest)
        assert torch.equal(attn.v_proj(x), v_dest)


def test_stage_copies_kv_that_arrive_from_elsewhere():
    spec = KVCacheSpec(2, 4, 4, 2, 8)
    cache = PagedKVCache(spec)
    policy = make_policy(LabConfig(nwor_mode="stage"), cache)
    window = Window.from_counts([3], [2], torch.tensor([1, 2, 3]), torch.tensor([7, 8]))
    policy.begin(window)
    key = torch.randn(3, 2, 8)
    for layer in range(2):
        dest = policy.kv_destination(layer, 0, 3)
        assert dest is not None and dest[0].shape == (3, 2, 8)
        policy.write(layer, key, key + 1)        # not the buffer's memory: copied
        assert torch.equal(policy.window_kv(layer)[0], key)
        assert torch.equal(policy.window_kv(layer)[1], key + 1)
    policy.commit(Acceptance.from_accepted_len(window, [1]))
    assert torch.equal(cache.key[1].reshape(-1, 2, 8)[1:3], key[:2])
    assert policy.kv_destination(0, 0, 3) is None          # no window open: nowhere
