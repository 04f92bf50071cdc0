"""A Llama decoder (RMSNorm, RoPE, GQA, SwiGLU) with two forward paths sharing one set of weights.

`forward(input_ids [T], md)`: flattened variable-length batch over the paged KV cache; each layer
writes its K/V through the write policy, then attends (`nwor_lab.model.attention`).
`forward_dense(input_ids [B, S])`: plain causal attention, no cache; what training uses.
Parameter names are Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nwor_lab.model.attention import AttentionMetadata, write_and_attend
from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.rope import Rotary
from nwor_lab.ops.fused import rms_norm, silu_mul


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype): one Triton kernel on CUDA
        at inference, torch's ops otherwise (`nwor_lab.ops.fused`)."""
        return rms_norm(x, self.weight, self.eps)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, in_features: int | None = None):
        """in_features: width of the attention input (EAGLE-3's layer reads 2 x hidden)."""
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        i = in_features or h
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(i, self.num_heads * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(i, self.num_kv_heads * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(i, self.num_kv_heads * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=cfg.attention_bias)
        self.scale = d ** -0.5

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x `[..., hidden]` -> q `[..., Hq, D]`, k/v `[..., H, D]` with RoPE on q and k."""
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        return Rotary.rotate(q, cos, sin), Rotary.rotate(k, cos, sin), v

    def forward(self, x, cos, sin, md: AttentionMetadata, layer: int) -> torch.Tensor:
        """x `[T, in_features]` -> `[T, hidden]`; writes this layer's K/V for the T tokens.

        Zero-copy staging: when the writer names a destination for this pass's K/V rows
        (`kv_destination`, the stage policy's buffer), the projections write there directly and
        the policy's `write` has nothing left to copy. The same ops run either way (bit-identical)."""
        n = x.shape[0]
        dest = md.writer.kv_destination(layer, md.write_offset, n)
        k_out, v_out = dest if dest is not None else (None, None)
        q = Rotary.rotate(self.q_proj(x).view(n, self.num_heads, self.head_dim), cos, sin)
        k = Rotary.rotate(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim), cos, sin, out=k_out)
        v = _linear(self.v_proj, x, None if v_out is None else v_out.view(n, -1))
        v = v.view(n, self.num_kv_heads, self.head_dim)
        o = write_and_attend(layer, q, k, v, md, self.scale)
        return self.o_proj(o.reshape(n, -1))

    def forward_dense(self, x, cos, sin) -> torch.Tensor:
        """x `[B, S, hidden]`, causal."""
        q, k, v = self.qkv(x, cos, sin)
        groups = self.num_heads // self.num_kv_heads  # GQA: each KV head serves `groups` query heads
        k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=self.scale)
        return self.o_proj(o.transpose(1, 2).reshape(*x.shape[:2], -1))


def _linear(lin: nn.Linear, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """`lin(x)` for x `[T, in]`, into `out` `[T, out_features]` when given: the same GEMM
    `F.linear` runs (mm, or addmm with a bias), so the result is bit-identical either way."""
    w = lin.weight.t()
    if lin.bias is None:
        return torch.mm(x, w, out=out)
    return torch.addmm(lin.bias, x, w, out=out)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))  # SwiGLU


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block. `input_norm=False` is EAGLE-1's first head layer (its input is fc's output)."""

    def __init__(self, cfg: LlamaConfig, input_norm: bool = True):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if input_norm else nn.Identity()
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin, md: AttentionMetadata | None = None, layer: int = 0):
        a = self.input_layernorm(x)
        if md is None:
            x = x + self.self_attn.forward_dense(a, cos, sin)
        else:
            x = x + self.self_attn(a, cos, sin, md, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)


class LlamaForCausalLM(nn.Module):
    """Target model. `forward` returns the final-norm hidden states (EAGLE's features) `[T, h]`;
    `compute_logits` maps hidden states to `[.., vocab]` (tied or own LM head)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, w)

    def forward(self, input_ids: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        """input_ids `[T]`, positions in `md` -> final-norm hidden `[T, hidden]`. Uses cache layers 0..N-1."""
        return self.forward_with_aux(input_ids, md)[0]

    def forward_with_aux(self, input_ids: torch.Tensor, md: AttentionMetadata, aux_layers=()):
        """-> (final-norm hidden `[T, h]`, aux `[T, len(aux_layers) * h]` or None): aux holds the
        residual stream entering each listed layer (EAGLE-3's low / middle / high features)."""
        return self.run_layers(input_ids, md.positions, aux_layers,
                               lambda i, layer, x, cos, sin: layer(x, cos, sin, md, i))

    def forward_dense(self, input_ids: torch.Tensor, aux_layers=()):
        """input_ids `[B, S]` -> final-norm hidden `[B, S, hidden]` (causal, positions 0..S-1);
        with `aux_layers`, a pair (hidden, aux `[B, S, len * hidden]`) as `forward_with_aux`."""
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden, aux = self.run_layers(input_ids, pos, aux_layers, lambda i, layer, x, cos, sin: layer(x, cos, sin))
        return (hidden, aux) if aux_layers else hidden

    def run_layers(self, input_ids: torch.Tensor, positions: torch.Tensor, aux_layers, run):
        """The one body of every forward: embed, rotary tables at `positions`, each decoder layer as
        `run(i, layer, x, cos, sin) -> x` (what a cached forward passes it is the only difference
        between targets: the hybrid adds its state layer and policy), final norm -> (hidden, aux or
        None), aux the residual stream entering each of `aux_layers`, concatenated on the last dim."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary.cos_sin(positions, x.dtype)
        aux = {}
        for i, layer in enumerate(self.model.layers):
            if i in aux_layers:
                aux[i] = x
            x = run(i, layer, x, cos, sin)
        return self.model.norm(x), (torch.cat([aux[i] for i in aux_layers], -1) if aux_layers else None)
