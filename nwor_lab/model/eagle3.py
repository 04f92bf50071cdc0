"""EAGLE-3 draft head: fused low/middle/high target features, one layer over [embed, hidden].

    fused  = fc(concat(a_low, a_mid, a_high))          [T, 3h] -> [T, h]   (first pass only)
    x      = concat(input_layernorm(embed(x[p+1])), hidden_norm(fused or g[p-1]))   [T, 2h]
    g      = fused + attn(x);  g = g + mlp(post_attention_layernorm(g))            (pre-norm out)
    logits = lm_head(norm(g)) over a draft vocabulary; draft id i is target id i + d2t[i]

`a_*` are the target's residual streams entering `aux_layers` (vLLM's default: layers 2, N // 2,
N - 3). Drafting a chain feeds `g` back in place of `fused`. Parameter names follow published
EAGLE-3 checkpoints: `fc.weight`, `midlayer.*` (incl. `midlayer.hidden_norm.weight`), `norm.weight`,
`lm_head.weight`, `d2t` (and `t2d`, which the lab does not need). K/V: cache layer N, as EAGLE-1.
"""
from __future__ import annotations

import torch
from torch import nn

from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.draft_head import DraftHead
from nwor_lab.model.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, RMSNorm


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    return (min(2, num_layers - 1), num_layers // 2, max(0, num_layers - 3))


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, in_features=2 * h)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, emb, hidden, cos, sin, md: AttentionMetadata | None = None, layer: int = 0):
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)
        a = self.self_attn.forward_dense(x, cos, sin) if md is None else self.self_attn(x, cos, sin, md, layer)
        g = hidden + a
        return g + self.mlp(self.post_attention_layernorm(g))


class Eagle3Head(DraftHead):
    def __init__(self, cfg: LlamaConfig, aux_layers, draft_vocab_size: int | None = None,
                 own_embedding: bool = False):
        super().__init__(cfg)
        h = cfg.hidden_size
        self.aux_layers = tuple(int(i) for i in aux_layers)
        self.draft_vocab_size = draft_vocab_size or cfg.vocab_size
        self.fc = nn.Linear(len(self.aux_layers) * h, h, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, self.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h) if own_embedding else None

    def _check_target(self, target: LlamaForCausalLM) -> None:
        bad = [i for i in self.aux_layers if not 0 <= i < target.config.num_hidden_layers]
        if bad:
            raise ValueError(f"aux_layers {bad} are not layers of the target "
                             f"(0..{target.config.num_hidden_layers - 1})")

    def features_from_target(self, hidden, aux) -> torch.Tensor:
        """What the first pass reads: the aux streams `[T, 3h]` fused by fc -> `[T, h]` (the same
        width as the head's own output, which a chain feeds back)."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def _fuse(self, features):
        return self.fc(features) if features.shape[-1] != self.config.hidden_size else features

    def compute_logits(self, g: torch.Tensor) -> torch.Tensor:
        """g `[n, h]` -> `[n, target vocab]`; tokens outside the draft vocabulary get -inf."""
        draft = self.lm_head(self.norm(g))
        if self.draft_vocab_size == self.config.vocab_size and not bool(self.d2t.any()):
            return draft
        full = draft.new_full((*draft.shape[:-1], self.config.vocab_size), float("-inf"))
        ids = torch.arange(self.draft_vocab_size, device=draft.device) + self.d2t
        return full.index_copy(-1, ids, draft)

    def forward(self, next_ids, features, md: AttentionMetadata) -> torch.Tensor:
        """next_ids `[T]`, features `[T, 3h]` (target aux) or `[T, h]` (own g) -> g `[T, h]`."""
        hidden = self._fuse(features.to(self.fc.weight.dtype))
        cos, sin = self.rotary.cos_sin(md.positions, hidden.dtype)
        return self.midlayer(self.embed(next_ids), hidden, cos, sin, md, self.layer_index)

    def forward_dense(self, next_ids, features) -> torch.Tensor:
        hidden = self._fuse(features.to(self.fc.weight.dtype))
        cos, sin = self.rotary.cos_sin(torch.arange(next_ids.shape[1], device=next_ids.device), hidden.dtype)
        return self.midlayer(self.embed(next_ids), hidden, cos, sin)
