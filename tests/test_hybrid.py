"""The hybrid target (gated DeltaNet + attention): paged forward = dense forward under every state
strategy; greedy speculative decoding by hand gives the target-only tokens under every strategy but
`off`, whose state keeps rejected drafts; its DeltaNet layer matches transformers' Qwen3-Next one."""
import pytest
import torch

from hybrid_decode import HandDecoder, speculative, target_only
from nwor_lab.model.hybrid import HybridConfig, HybridForCausalLM
from nwor_lab.model.toy import toy_hybrid
from nwor_lab.state import STATE_POLICIES

PROMPTS = [[1, 5, 9, 2, 7], [3, 3, 8], [30, 2, 11, 4, 4, 6, 1]]
K = 3


def spoil(w, r):
    """Where request r's acceptance ends in window w: every length 0..k, differing per request."""
    return (w + 2 * r) % (K + 2)          # K and K+1: nothing spoiled (all accepted)


def test_config_layout():
    cfg = toy_hybrid().config
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert HybridConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="layer_types"):
        HybridConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                     num_attention_heads=2, layer_types=["linear_attention"])
    model = toy_hybrid()
    assert model.num_layers == 1 and model.num_state_layers == 3
    with pytest.raises(ValueError, match="states"):          # a hybrid without its state policy
        model.model.layers[0].linear_attn(torch.zeros(2, model.config.hidden_size), None, 0)
    names = {n for n, _ in model.named_parameters()}
    assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in names
    assert "model.layers.3.self_attn.q_proj.weight" in names


@pytest.mark.parametrize("state_mode", sorted(STATE_POLICIES))
def test_paged_equals_dense(state_mode):
    """Prefill (chunked form past 16 rows) and then windows of 1 and 3 rows, no drafts: every
    strategy carries the state as the dense forward does."""
    model = toy_hybrid(1)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 32, (24,), generator=gen).tolist() for _ in range(2)]
    got = [[], []]
    # one pass at a time, committed, collecting the hidden states
    dec = HandDecoder(model, 2, k=2, state_mode=state_mode)
    done = 0
    for n in (18, 1, 3, 2):
        rows = [s[done:done + n] for s in seqs]
        window, logits = dec.forward(rows, [0, 0])
        dec.commit(window, [0, 0])
        got[0].append(logits[:n]), got[1].append(logits[n:])
        done += n
    with torch.no_grad():
        want = model.compute_logits(model.forward_dense(torch.tensor(seqs)))
    for s in range(2):
        torch.testing.assert_close(torch.cat(got[s]), want[s], atol=1e-4, rtol=1e-4)


def test_speculative_equals_target_only_except_off():
    model = toy_hybrid(2)
    want = target_only(model, PROMPTS, 16)
    tokens = {}
    for mode in sorted(STATE_POLICIES):
        tokens[mode], history = speculative(model, PROMPTS, 16, K, spoil, state_mode=mode, reference=want)
        assert any(a < K for acc in history for a in acc) and any(a == K for acc in history for a in acc)
    for mode, got in tokens.items():
        if STATE_POLICIES[mode].commits_accepted_only:
            assert got == want, mode
    assert tokens["off"] != want, "off kept the rejected drafts' state and still matched: a weak test model"


def test_store_after_each_window_equals_target_only_decoding():
    """After every window the committed recurrent and conv state of each request equals the state
    target-only decoding reaches at the same length (fp32 tolerance: the window's GEMMs see more
    rows than one-token decoding's, so the layer inputs round differently); off's drifts away."""
    model = toy_hybrid(3)
    reached = {}                           # (request, committed length) -> target-only state

    def record(dec, w):
        for r, n in enumerate(dec.lens):
            reached[r, n] = [t.clone() for t in dec.states.committed(r)]
    want = target_only(model, PROMPTS, 14 + K + 1, on_step=record)   # covers what a last window overshoots
    for mode in sorted(STATE_POLICIES):
        seen = []

        def check(dec, w):
            for r, n in enumerate(dec.lens):
                got, ref = dec.states.committed(r), reached[r, n]
                seen.append(all(torch.allclose(x, y, atol=1e-4, rtol=1e-4) for x, y in zip(got, ref)))
        speculative(model, PROMPTS, 14, K, spoil, state_mode=mode, reference=want, on_window=check)
        assert all(seen) if STATE_POLICIES[mode].commits_accepted_only else not all(seen), mode


def hf_layer(model):
    """transformers' Qwen3NextGatedDeltaNet holding the toy hybrid's layer-0 weights (skip without it)."""
    transformers = pytest.importorskip("transformers")
    qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    cfg = model.config
    hf_cfg = transformers.Qwen3NextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, linear_num_key_heads=cfg.linear_num_key_heads,
        linear_num_value_heads=cfg.linear_num_value_heads, linear_key_head_dim=cfg.linear_key_head_dim,
        linear_value_head_dim=cfg.linear_value_head_dim, linear_conv_kernel_dim=cfg.linear_conv_kernel_dim,
        rms_norm_eps=cfg.rms_norm_eps, hidden_act="silu", layer_types=["linear_attention"])
    hf = qn.Qwen3NextGatedDeltaNet(hf_cfg, layer_idx=0)
    # its torch paths on CPU tensors even where fla / causal-conv1d are installed (their kernels are CUDA)
    hf.chunk_gated_delta_rule, hf.causal_conv1d_fn = qn.torch_chunk_gated_delta_rule, None
    hf.norm = qn.Qwen3NextRMSNormGated(cfg.linear_value_head_dim, eps=cfg.rms_norm_eps)
    missing, unexpected = hf.load_state_dict(model.model.layers[0].linear_attn.state_dict(), strict=False)
    assert not missing and not unexpected
    return transformers, hf_cfg, hf


def test_hf_qwen3_next_decode_state_matches_the_store():
    """Prefill then one-token decodes through transformers' layer and its cache, and through the
    lab's layer and a state store: same outputs, same recurrent state, and the same conv inputs (HF
    keeps the last W, the lab the last W - 1)."""
    model = toy_hybrid(6)
    transformers, hf_cfg, hf = hf_layer(model)
    from nwor_lab.config import LabConfig
    from nwor_lab.state import make_state_policy, make_state_store
    from nwor_lab.window import Window
    lab = model.model.layers[0].linear_attn
    config = LabConfig(state_mode="stage")
    store = make_state_store(config, model.state_spec(), 1, k=0)
    states = make_state_policy(config, store)
    cache = transformers.DynamicCache(config=hf_cfg)
    x = torch.randn(1, 8, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    W = model.config.linear_conv_kernel_dim
    with torch.no_grad():
        for a, b in ((0, 5), (5, 6), (6, 7), (7, 8)):
            want = hf(x[:, a:b], cache=cache)
            states.begin(Window.from_counts([b - a], [0], torch.arange(b - a)), [0], layers=range(1))
            got = lab(x[0, a:b], states, 0)
            states.commit()
            torch.testing.assert_close(got, want[0], atol=1e-5, rtol=1e-4)
            recurrent, conv = store.committed(0, 0)
            torch.testing.assert_close(recurrent, cache.layers[0].recurrent_states[0][0], atol=1e-5, rtol=1e-4)
            assert torch.equal(conv, cache.layers[0].conv_states[0][0, :, -(W - 1):].t())


def test_hf_qwen3_next_gated_deltanet_matches():
    """transformers' Qwen3NextGatedDeltaNet with the lab layer's weights gives the same output (its
    torch fallback: chunked prefill from zeros), where transformers has it."""
    model = toy_hybrid(4)
    _, _, hf = hf_layer(model)
    x = torch.randn(2, 9, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(x), model.model.layers[0].linear_attn.forward_dense(x), atol=1e-5, rtol=1e-4)


def test_checkpoint_round_trip(tmp_path):
    """save_llama / load_llama keep the hybrid (config.json `model_type` nwor_hybrid)."""
    from nwor_lab.model.loader import load_llama, save_llama
    model = toy_hybrid(5)
    save_llama(model, tmp_path, dtype=torch.float32)
    loaded = load_llama(tmp_path)
    assert isinstance(loaded, HybridForCausalLM) and loaded.config == model.config
    x = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(loaded.forward_dense(x), model.forward_dense(x))
