"""EAGLE-1 draft head: `fc(concat(embed(token), feature))` -> one Llama layer -> target LM head.

Alignment (vLLM's): the head's row at position p reads the NEXT token x[p+1] and the target's
final-norm hidden state f[p] (the feature that predicted x[p+1]); its output g[p] is a predicted
feature for position p+1, whose logits (target LM head) propose x[p+2]. Its K/V lives at the
same slot as the target's position p, in cache layer `layer_index` (= the target's layer count).
Layer 0 has no input norm (EAGLE-1), and nothing follows the layer but the target's LM head.
"""
from __future__ import annotations

import torch
from torch import nn

from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.draft_head import DraftHead
from nwor_lab.model.llama import LlamaDecoderLayer, LlamaForCausalLM


class EagleHead(DraftHead):
    """Parameters as in published EAGLE-1 checkpoints: `fc.weight` (`fc.bias`), `layers.0.*`,
    optionally `embed_tokens.weight` (else the target's embedding is used)."""

    def __init__(self, cfg: LlamaConfig, fc_bias: bool = True, own_embedding: bool = False):
        super().__init__(cfg)
        if cfg.num_hidden_layers != 1:
            raise ValueError(f"EAGLE-1 heads have one decoder layer, config says {cfg.num_hidden_layers}")
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=fc_bias)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg, input_norm=False)])
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if own_embedding else None

    def _check_target(self, target: LlamaForCausalLM) -> None:
        if target.config.vocab_size != self.config.vocab_size:
            raise ValueError(f"draft vocab_size {self.config.vocab_size} != target {target.config.vocab_size}")

    def features_from_target(self, hidden: torch.Tensor, aux) -> torch.Tensor:
        """What the first pass reads as f[p]: the target's final-norm hidden state (EAGLE-1
        reads no aux layers)."""
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.compute_logits(hidden)

    def forward(self, next_ids: torch.Tensor, features: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        """next_ids `[T]` (x[p+1]), features `[T, h]` (f[p]), positions p in `md` -> g `[T, h]`."""
        x = self.fc(torch.cat([self.embed(next_ids), features.to(self.fc.weight.dtype)], dim=-1))
        cos, sin = self.rotary.cos_sin(md.positions, x.dtype)
        return self.layers[0](x, cos, sin, md, self.layer_index)

    def forward_dense(self, next_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """next_ids `[B, S]`, features `[B, S, h]` -> `[B, S, h]`, causal over positions 0..S-1."""
        x = self.fc(torch.cat([self.embed(next_ids), features.to(self.fc.weight.dtype)], dim=-1))
        pos = torch.arange(next_ids.shape[1], device=next_ids.device)
        cos, sin = self.rotary.cos_sin(pos, x.dtype)
        return self.layers[0](x, cos, sin)
