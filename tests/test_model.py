"""The paged Llama and EAGLE head agree with their dense (training) forward, in every read mode."""
import math

import pytest
import torch

from nwor_lab.config import LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model import AttentionMetadata, LlamaConfig, LlamaForCausalLM
from nwor_lab.model.rope import inv_frequencies
from nwor_lab.model.toy import toy_config, toy_pair
from nwor_lab.policies import Window, make_policy


def make_cache(cfg, num_layers, num_blocks=32, block_size=4, layout="NHD", cache_dtype="auto"):
    return PagedKVCache(KVCacheSpec(num_layers, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                                    layout=layout, cache_dtype=cache_dtype))


def test_llama3_rope_scaling_bands():
    theta, d = 500000.0, 64
    sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    base, scaled = inv_frequencies(d, theta), inv_frequencies(d, theta, sc)
    wavelen = 2 * math.pi / base
    high = wavelen < 8192 / 4          # short wavelengths: unchanged
    low = wavelen > 8192 / 1           # long wavelengths: divided by factor
    assert torch.allclose(scaled[high], base[high])
    assert torch.allclose(scaled[low], base[low] / 8)
    mid = ~high & ~low                 # in between: strictly between the two
    assert bool(((scaled[mid] < base[mid]) & (scaled[mid] > base[mid] / 8)).all())
    assert torch.allclose(inv_frequencies(d, theta, {"type": "linear", "factor": 2.0}), base / 2)
    with pytest.raises(ValueError, match="not supported"):
        LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, rope_scaling={"rope_type": "yarn"})


def test_gqa_config_checks():
    with pytest.raises(ValueError, match="multiple"):
        toy_config(num_attention_heads=4, num_key_value_heads=3)


def paged_forward(model, seqs, cache, chunks, policy=None):
    """Run `seqs` through the paged model in windows of `chunks[i]` tokens per request; return the
    hidden states of every position, per request."""
    bs = cache.spec.block_size
    tables = [list(range(i * 8, i * 8 + 8)) for i in range(len(seqs))]
    done = [0] * len(seqs)
    out = [[] for _ in seqs]
    for n in chunks:
        ids, pos, qlens, ctx = [], [], [], []
        for s, seq in enumerate(seqs):
            take = seq[done[s]:done[s] + n]
            ids += take
            pos += range(done[s], done[s] + len(take))
            qlens.append(len(take)), ctx.append(done[s])
        slots = torch.tensor([tables[s][p // bs] * bs + p % bs for s in range(len(seqs))
                              for p in range(ctx[s], ctx[s] + qlens[s])])
        if policy is not None:
            policy.begin(Window.from_counts(qlens, [0] * len(seqs), slots))
        # the writer (policy) declares where attention reads the window: cache or its buffer
        starts = torch.tensor([0] + qlens).cumsum(0).tolist()
        md = AttentionMetadata.build(cache, policy, pos, qlens, tables, ctx)
        h = model(torch.tensor(ids), md)
        if policy is not None:
            policy.commit()
        for s in range(len(seqs)):
            out[s].append(h[starts[s]:starts[s + 1]])
            done[s] += qlens[s]
    return [torch.cat(o) for o in out]


@pytest.mark.parametrize("mode", [None, "off", "cow", "stage"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_equals_dense(mode, layout):
    target, _ = toy_pair(0)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 16, (12,), generator=gen).tolist() for _ in range(3)]
    cache = make_cache(target.config, target.num_layers, layout=layout)
    policy = None if mode is None else make_policy(LabConfig(nwor_mode=mode), cache)
    with torch.no_grad():
        got = paged_forward(target, seqs, cache, [5, 1, 3, 3], policy)
        for s, seq in enumerate(seqs):
            want = target.forward_dense(torch.tensor([seq]))[0]
            torch.testing.assert_close(got[s], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_stage_reads_the_window_as_the_cache_would(cache_dtype):
    """With an fp8 cache, stage attends to quantised-then-scaled window rows: bit-identical to off."""
    target, _ = toy_pair(0)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 16, (9,), generator=gen).tolist() for _ in range(2)]
    out = {}
    for mode in ("off", "stage"):
        cache = make_cache(target.config, target.num_layers, cache_dtype=cache_dtype)
        for layer in range(target.num_layers):
            cache.set_scales(layer, 0.05)
        with torch.no_grad():
            out[mode] = paged_forward(target, seqs, cache, [4, 5], make_policy(LabConfig(nwor_mode=mode), cache))
    assert all(torch.equal(a, b) for a, b in zip(out["off"], out["stage"]))


def test_tied_and_untied_heads():
    cfg = LlamaConfig(
        vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=1, tie_word_embeddings=True)
    m = LlamaForCausalLM(cfg)
    assert m.lm_head is None and "lm_head.weight" not in m.state_dict()
    h = torch.randn(3, 32)
    torch.testing.assert_close(m.compute_logits(h), h @ m.model.embed_tokens.weight.T)


def test_eagle_head_paged_equals_dense():
    target, head = toy_pair(1)
    gen = torch.Generator().manual_seed(1)
    seq = torch.randint(0, 16, (10,), generator=gen)
    cache = make_cache(target.config, target.num_layers + 1)
    with torch.no_grad():
        f = target.forward_dense(seq[None])[0]
        want = head.forward_dense(seq[None, 1:], f[None, :-1])[0]
        md = AttentionMetadata.build(cache, None, list(range(9)), [9], [list(range(8))], [0])
        got = head(seq[1:], f[:-1], md)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert head.layer_index == target.num_layers
    # the head wrote layer N only
    assert cache.key[head.layer_index].abs().sum() > 0 and cache.key[:target.num_layers].abs().sum() == 0
