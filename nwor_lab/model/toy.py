"""A toy target + EAGLE head with random weights and *tunable* acceptance, for tests and notebooks.

The target is close to a bigram machine: its LM head maps a token's embedding to the embedding
of `perm(token)`, and its decoder layers add noise of scale `noise` on top of the residual
stream. The head's fc passes the next token's embedding straight through, so its draft is
`perm(x)` too, except where the noise (target layers, head layer) makes them disagree.
`noise` 0.2 gives a mix of full, partial and zero acceptance at k=4.
"""
from __future__ import annotations

import torch

from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.eagle import EagleHead
from nwor_lab.model.llama import LlamaForCausalLM


def toy_config(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, **kw) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                       num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                       num_key_value_heads=num_key_value_heads, tie_word_embeddings=False, **kw)


@torch.no_grad()
def toy_pair(seed: int = 0, noise: float = 0.2, cfg: LlamaConfig | None = None, dtype=torch.float32):
    """-> (target, head) in eval mode, on CPU."""
    cfg = cfg or toy_config()
    gen = torch.Generator().manual_seed(seed)
    target = LlamaForCausalLM(cfg)
    for name, p in target.named_parameters():
        if p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=gen) * noise)
    emb = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    target.model.embed_tokens.weight.copy_(emb)
    perm = torch.randperm(cfg.vocab_size, generator=gen)
    inv = torch.argsort(perm)
    target.lm_head.weight.copy_(emb[inv])          # logit j is large for token j = perm(t)
    head_cfg = LlamaConfig(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__ if f != "extra"},
                              "num_hidden_layers": 1})
    head = EagleHead(head_cfg, fc_bias=True)
    for name, p in head.named_parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * noise if p.dim() == 2 else torch.ones_like(p)
                if "norm" in name else torch.zeros_like(p))
    h = cfg.hidden_size
    head.fc.weight.copy_(torch.cat([torch.eye(h), torch.randn(h, h, generator=gen) * noise * 0.1], dim=1))
    head.attach(target)
    return target.to(dtype).eval(), head.to(dtype).eval()


@torch.no_grad()
def toy_eagle3(target, seed: int = 0, aux_layers=None, draft_vocab_size: int | None = None, scale: float = 0.3):
    """A random EAGLE-3 head for `target`; a smaller draft vocabulary spreads evenly over the
    target's (draft id i -> target id i * V // draft_vocab_size)."""
    from nwor_lab.model.eagle3 import Eagle3Head, default_aux_layers
    cfg = target.config
    head_cfg = LlamaConfig(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__ if f != "extra"},
                              "num_hidden_layers": 1})
    aux = aux_layers or default_aux_layers(cfg.num_hidden_layers)
    head = Eagle3Head(head_cfg, aux, draft_vocab_size)
    gen = torch.Generator().manual_seed(seed)
    for name, p in head.named_parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * scale if p.dim() == 2 else torch.ones_like(p))
    if head.draft_vocab_size < cfg.vocab_size:
        i = torch.arange(head.draft_vocab_size)
        head.d2t.copy_(i * cfg.vocab_size // head.draft_vocab_size - i)
    return head.attach(target).to(next(target.parameters()).dtype).eval()


@torch.no_grad()
def toy_hybrid(seed: int = 0, vocab_size: int = 32, hidden_size: int = 32, num_hidden_layers: int = 4,
               dtype=torch.float32, **kw):
    """A random hybrid target (nwor_lab.model.hybrid): 3 gated DeltaNet layers to 1 attention layer
    (Qwen3-Next's 3:1), on CPU, eval mode. Weights ~ N(0, 0.2) so every layer changes the output."""
    from nwor_lab.model.hybrid import HybridConfig, HybridForCausalLM
    cfg = HybridConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                       num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                       linear_value_head_dim=8, **kw)
    gen = torch.Generator().manual_seed(seed)
    model = HybridForCausalLM(cfg)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if "conv1d" in name else 0.2))
    model.model.embed_tokens.weight.copy_(torch.randn(vocab_size, hidden_size, generator=gen))
    for layer in model.model.layers:
        if layer.layer_type == "linear_attention":
            layer.linear_attn.init_decay(gen)
    return model.to(dtype).eval()


def toy_hybrid_head(target, seed: int = 3) -> EagleHead:
    """An EAGLE-1 head for a toy hybrid target, attached, eval mode: fc passes the next token's
    embedding through (identity on that half of its input), the rest ~ N(0, 0.2): it drafts well
    enough that windows both accept and reject."""
    from nwor_lab.model.shapes import head_config
    cfg = target.config
    head = EagleHead(head_config(cfg), fc_bias=True)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 if p.dim() == 2 else
                    torch.ones_like(p) if "norm" in name else torch.zeros_like(p))
        h = cfg.hidden_size
        head.fc.weight.copy_(torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1))
    return head.attach(target).eval()
