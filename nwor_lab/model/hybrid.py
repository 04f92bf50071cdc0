"""A hybrid target: the lab's Llama with some layers replaced by gated DeltaNet (Qwen3-Next's 3:1).

`HybridConfig` is a `LlamaConfig` plus Qwen3-Next's linear-attention fields (`layer_types`,
`linear_num_key_heads`, ...). Attention layers (`self_attn`) are the Llama's: paged K/V through the
write policy (`AttentionMetadata`, cache layers numbered over the attention layers only, so the
EAGLE head's cache layer is the attention-layer count). Linear layers (`linear_attn`, parameters as
Qwen3-Next's `Qwen3NextGatedDeltaNet`) keep a recurrent and a conv state per request in a
`nwor_lab.state` store, through the state policy passed as `states` (state layers numbered over the
linear layers only).

Not a checkpoint transformers loads as a whole: Qwen3-Next's attention layers are gated (q_proj
twice as wide, a sigmoid output gate), normalise q and k, rotate a quarter of each head, and its
RMSNorms scale by 1 + weight; the lab keeps its Llama attention (and its kernels). Its gated
DeltaNet layer matches transformers' to fp32 rounding (tests/test_hybrid.py, where transformers is
installed).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.gated_deltanet import GatedDeltaNet
from nwor_lab.model.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, RMSNorm
from nwor_lab.state.gated_delta import GatedDeltaRecurrence
from nwor_lab.state.store import RecurrentSpec

LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class HybridConfig(LlamaConfig):
    """layer_types: one of LAYER_TYPES per layer (None: every 4th layer full attention, as
    Qwen3-Next's `full_attention_interval` 4). The linear layers' shape as Qwen3-Next names it."""

    layer_types: tuple | None = None
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 2
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    linear_conv_kernel_dim: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        types = self.layer_types
        if types is None:
            types = tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                          for i in range(self.num_hidden_layers))
        types = tuple(types)
        if len(types) != self.num_hidden_layers or any(t not in LAYER_TYPES for t in types):
            raise ValueError(f"layer_types={list(types)}: give one of {', '.join(LAYER_TYPES)} for each of the "
                             f"{self.num_hidden_layers} layers")
        object.__setattr__(self, "layer_types", types)
        for name in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                     "linear_value_head_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}: expected an integer >= 1")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"linear_num_value_heads={self.linear_num_value_heads} is not a multiple of "
                             f"linear_num_key_heads={self.linear_num_key_heads}")
        if isinstance(self.linear_conv_kernel_dim, bool) or not isinstance(self.linear_conv_kernel_dim, int) \
                or self.linear_conv_kernel_dim < 2:
            raise ValueError(f"linear_conv_kernel_dim={self.linear_conv_kernel_dim!r}: expected an integer >= 2")

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["layer_types"] = list(self.layer_types)
        d.update(architectures=["NworHybridForCausalLM"], model_type="nwor_hybrid")
        return d


class HybridDecoderLayer(nn.Module):
    """Pre-norm block whose mixer is Llama attention (`self_attn`) or gated DeltaNet (`linear_attn`)."""

    def __init__(self, cfg: HybridConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if layer_type == "full_attention":
            self.self_attn = LlamaAttention(cfg)
        else:
            self.linear_attn = GatedDeltaNet(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin, md: AttentionMetadata | None = None, index: int = 0, states=None):
        """index: this layer's cache layer (attention) or state layer (linear)."""
        a = self.input_layernorm(x)
        if self.layer_type == "full_attention":
            x = x + (self.self_attn.forward_dense(a, cos, sin) if md is None else self.self_attn(a, cos, sin, md, index))
        else:
            x = x + (self.linear_attn.forward_dense(a) if md is None else self.linear_attn(a, states, index))
        return x + self.mlp(self.post_attention_layernorm(x))


class HybridForCausalLM(LlamaForCausalLM):
    """Target model; as `LlamaForCausalLM`, with `states` (a StatePolicy whose window is open, the
    same window as the K/V policy's) passed to `forward` / `forward_with_aux`, or carried in
    `AttentionMetadata.states` (so a step body calls every target alike)."""

    def __init__(self, cfg: HybridConfig):
        if not isinstance(cfg, HybridConfig):
            raise TypeError(f"cfg: expected a HybridConfig, got {type(cfg).__name__}")
        super().__init__(cfg)
        self.model.layers = nn.ModuleList(HybridDecoderLayer(cfg, t) for t in cfg.layer_types)
        # each layer's index in its own store: cache layer for attention, state layer for linear
        self.store_index = []
        counts = {t: 0 for t in LAYER_TYPES}
        for t in cfg.layer_types:
            self.store_index.append(counts[t])
            counts[t] += 1
        self._num_attention, self._num_linear = counts["full_attention"], counts["linear_attention"]

    @property
    def num_layers(self) -> int:
        """K/V cache layers: the attention layers (the EAGLE head's is the next one)."""
        return self._num_attention

    @property
    def num_state_layers(self) -> int:
        return self._num_linear

    def state_spec(self, dtype: torch.dtype | None = None) -> RecurrentSpec:
        """The recurrent store's shape for this model (conv state in `dtype`, default the weights'); its
        linear layers run the gated delta rule (`states.recur(layer, q, k, v, g, beta)`)."""
        c = self.config
        layer = next(l.linear_attn for l in self.model.layers if l.layer_type == "linear_attention")
        return RecurrentSpec(num_layers=self._num_linear, num_heads=c.linear_num_value_heads,
                             head_k_dim=c.linear_key_head_dim, head_v_dim=c.linear_value_head_dim,
                             conv_dim=layer.conv_dim, conv_width=c.linear_conv_kernel_dim,
                             dtype=dtype or self.model.embed_tokens.weight.dtype, recurrence=GatedDeltaRecurrence())

    def forward(self, input_ids: torch.Tensor, md: AttentionMetadata, states=None) -> torch.Tensor:
        return self.forward_with_aux(input_ids, md, states=states)[0]

    def forward_with_aux(self, input_ids: torch.Tensor, md: AttentionMetadata, aux_layers=(), states=None):
        """As LlamaForCausalLM's; `states` (default `md.states`): the state policy with the window open.
        Each layer also gets its index in its own store and the state policy."""
        states = md.states if states is None else states
        return self.run_layers(input_ids, md.positions, aux_layers, lambda i, layer, x, cos, sin:
                               layer(x, cos, sin, md, self.store_index[i], states))
