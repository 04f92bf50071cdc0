"""What every EAGLE draft head shares: attached to a target, one cache layer after the target's.

A head is a small module the engine calls as `head(next_ids [T], features [T, *], md) -> g [T, h]`
and whose K/V lives in cache layer `layer_index` (= the target's layer count), written through
the same write policy as the target's layers. Subclasses (EAGLE-1, EAGLE-3) say what they read
from the target (`aux_layers`, `features_from_target`) and how they produce logits.
"""
from __future__ import annotations

import torch
from torch import nn

from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.rope import Rotary


class DraftHead(nn.Module):
    aux_layers: tuple = ()   # target layers whose inputs the head reads (EAGLE-3); () = none

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.target = None   # attached, not a submodule (not in the head's state_dict)

    def attach(self, target) -> "DraftHead":
        """Bind the head to its target (hidden sizes must match: the head reads its states)."""
        t = target.config
        if t.hidden_size != self.config.hidden_size:
            raise ValueError(f"draft hidden_size {self.config.hidden_size} != target hidden_size "
                             f"{t.hidden_size}: the head consumes the target's hidden states")
        self._check_target(target)
        object.__setattr__(self, "target", target)
        return self

    def _check_target(self, target) -> None:
        """Subclass checks beyond the hidden size."""

    @property
    def layer_index(self) -> int:
        """Cache layer of this head: one after the target's layers."""
        return self.target.num_layers

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The head's own embedding when it has one, else the target's."""
        emb = getattr(self, "embed_tokens", None)
        return (emb if emb is not None else self.target.model.embed_tokens)(ids)

    def features_from_target(self, hidden: torch.Tensor, aux) -> torch.Tensor:
        raise NotImplementedError

    def compute_logits(self, g: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
