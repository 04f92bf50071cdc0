"""A gated DeltaNet layer (linear attention with a recurrent state), laid out as Qwen3-Next's.

Parameters (transformers' `Qwen3NextGatedDeltaNet`, so its weights load either way):
    in_proj_qkvz  [2*Nk*K + 2*Nv*V, h]   q, k, v and the output gate z, grouped per key head
    in_proj_ba    [2*Nv, h]              beta's and the decay's inputs, grouped per key head
    conv1d        [C, 1, W]              depthwise causal conv over the C = 2*Nk*K + Nv*V mixed q/k/v
    dt_bias, A_log [Nv]                  decay g = -exp(A_log) * softplus(a + dt_bias)
    norm.weight   [V]                    gated RMSNorm: weight * rmsnorm(o) * silu(z)
    out_proj      [h, Nv*V]

Per token: mix = in_proj(x); q, k, v = split(silu(conv(mix))); q, k L2-normalised and repeated to
the Nv value heads; o = gated delta rule (nwor_lab.ops.gated_delta); out = out_proj(norm(o, z)).

Why gated DeltaNet rather than Mamba2: fla-core (flash-linear-attention's kernels) is a pure-Python
wheel whose Triton kernels run on the lab's GPU machines, while mamba-ssm has no binary wheel for
them (source builds only); and Qwen3-Next / Kimi Linear use it.

`forward(x [T, h], states, layer)` runs a window's rows through a state policy (nwor_lab.state: it
holds the conv and recurrent state per request and decides what the window may write);
`forward_dense(x [B, S, h])` starts every sequence from zeros (training, and the dense oracle).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nwor_lab.ops.gated_delta import gated_delta_rule, l2norm


class RMSNormGated(nn.Module):
    """transformers' `Qwen3NextRMSNormGated`: weight * rmsnorm(x) * silu(gate), in that dtype order."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.weight * x.to(dtype)
        return (x * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg):
        """cfg: a HybridConfig (linear_num_key_heads Nk, linear_num_value_heads Nv,
        linear_key_head_dim K, linear_value_head_dim V, linear_conv_kernel_dim W)."""
        super().__init__()
        self.num_k_heads, self.num_v_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = self.num_k_heads * self.head_k_dim, self.num_v_heads * self.head_v_dim
        self.conv_width = cfg.linear_conv_kernel_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        h = cfg.hidden_size
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.conv_width, groups=self.conv_dim, bias=False,
                                padding=self.conv_width - 1)
        self.in_proj_qkvz = nn.Linear(h, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(h, 2 * self.num_v_heads, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads).uniform_(1, 16).log())
        self.norm = RMSNormGated(self.head_v_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)

    def project(self, x: torch.Tensor):
        """x `[..., h]` -> (mixed q/k/v `[..., C]`, z `[..., Nv, V]`, b, a `[..., Nv]`). The projections
        are grouped per key head (transformers' `fix_query_key_value_ordering`)."""
        lead, nk, r = x.shape[:-1], self.num_k_heads, self.num_v_heads // self.num_k_heads
        qkvz = self.in_proj_qkvz(x).view(*lead, nk, 2 * self.head_k_dim + 2 * r * self.head_v_dim)
        ba = self.in_proj_ba(x).view(*lead, nk, 2 * r)
        q, k, v, z = torch.split(qkvz, [self.head_k_dim, self.head_k_dim, r * self.head_v_dim, r * self.head_v_dim], -1)
        b, a = torch.split(ba, [r, r], -1)
        mixed = torch.cat([q.reshape(*lead, -1), k.reshape(*lead, -1), v.reshape(*lead, -1)], -1)
        return (mixed, z.reshape(*lead, self.num_v_heads, self.head_v_dim),
                b.reshape(*lead, self.num_v_heads), a.reshape(*lead, self.num_v_heads))

    def rule_inputs(self, conv_out: torch.Tensor, b: torch.Tensor, a: torch.Tensor):
        """conv output `[..., C]` (before SiLU) -> q, k `[..., Nv, K]` (L2-normalised, repeated to the
        value heads), v `[..., Nv, V]`, g (log decay, float32), beta `[..., Nv]`."""
        lead = conv_out.shape[:-1]
        q, k, v = torch.split(F.silu(conv_out), [self.key_dim, self.key_dim, self.value_dim], -1)
        q = q.reshape(*lead, self.num_k_heads, self.head_k_dim)
        k = k.reshape(*lead, self.num_k_heads, self.head_k_dim)
        r = self.num_v_heads // self.num_k_heads
        if r > 1:
            q, k = q.repeat_interleave(r, dim=-2), k.repeat_interleave(r, dim=-2)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        return l2norm(q), l2norm(k), v.reshape(*lead, self.num_v_heads, self.head_v_dim), g, b.sigmoid()

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o `[..., Nv, V]` -> `[..., h]`: gated RMSNorm per head, then out_proj."""
        return self.out_proj(self.norm(o, z).flatten(-2))

    def forward(self, x: torch.Tensor, states, layer: int) -> torch.Tensor:
        """x `[T, h]`, the rows of the window `states` (a StatePolicy) has open -> `[T, h]`; the
        policy runs the conv and the recurrence from each request's committed state."""
        if states is None:
            raise ValueError("states: a hybrid model's linear-attention layers need the state policy with "
                             "the window open (nwor_lab.state.make_state_policy(...).begin(window, slots))")
        mixed, z, b, a = self.project(x)
        conv_out = states.conv(layer, mixed, self.conv1d.weight[:, 0])
        q, k, v, g, beta = self.rule_inputs(conv_out, b, a)
        o = states.recur(layer, q, k, v, g, beta)
        return self.output(o.to(x.dtype), z)

    def forward_dense(self, x: torch.Tensor) -> torch.Tensor:
        """x `[B, S, h]`, every sequence from a zero state -> `[B, S, h]`."""
        S = x.shape[1]
        mixed, z, b, a = self.project(x)
        conv_out = self.conv1d(mixed.transpose(1, 2))[..., :S].transpose(1, 2)
        q, k, v, g, beta = self.rule_inputs(conv_out, b, a)
        # every (sequence, head) pair is its own recurrence: fold the batch into the heads
        B, H = x.shape[0], self.num_v_heads
        fold = lambda t: t.transpose(0, 1).reshape(S, B * H, *t.shape[3:])       # noqa: E731
        # the recurrence in float32 even under training's bf16 autocast (its matmuls would drop to bf16)
        with torch.autocast(x.device.type, enabled=False):
            o = gated_delta_rule(fold(q), fold(k), fold(v), fold(g), fold(beta), backend="torch")[0]
        return self.output(o.view(S, B, H, -1).transpose(0, 1).to(x.dtype), z)

    @torch.no_grad()
    def init_decay(self, generator: torch.Generator | None = None) -> None:
        """Qwen3-Next's initial decay spread: A in [1, 16), dt_bias = softplus^-1 of dt in [1e-3, 1e-1]
        (log-uniform), so heads forget at different rates."""
        n = self.num_v_heads
        self.A_log.copy_(torch.empty(n).uniform_(1, 16, generator=generator).log())
        dt = torch.exp(torch.rand(n, generator=generator) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
