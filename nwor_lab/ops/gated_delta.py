"""Gated DeltaNet: the recurrence of a linear-attention layer, and the short causal conv in front of it.

One sequence, `T` tokens, `H` value heads (q/k already repeated to `H` heads when the layer has
fewer key heads), key size `K`, value size `V`. The state `S` `[H, K, V]` is float32. Per token t
(Qwen3-Next, fla's `gated_delta_rule`, q and k L2-normalised beforehand, q scaled by K^-1/2):

    S      = S * exp(g_t)                          # decay (g_t <= 0, per head)
    delta  = beta_t * (v_t - k_t^T S)              # the delta rule: correct what S recalls for k_t
    S      = S + k_t delta^T                       # rank-one write
    o_t    = q_t^T S                               # read

A verify window advances S through every one of its rows; that is why a rejected draft cannot be
taken back by bookkeeping (nwor_lab.state keeps the state under the write policies).

Two torch references compute the same thing:
  `gated_delta_recurrent_reference`   token by token (the decode / verify form, obviously right)
  `gated_delta_chunk_reference`       chunked (WY form, as fla's `chunk_gated_delta_rule` and
                                      transformers' `torch_chunk_gated_delta_rule`): the prefill form
Both return the output and the states after the rows `keep_from .. T-1` (a verify window keeps the
state after each of `t_last, d_1 .. d_k`, the positions one of which will be committed).

`gated_delta_rule` dispatches: fla's Triton kernels (fla-core) for CUDA tensors when `fla` imports
and the backend allows it; else the recurrent reference for short runs (<= RECURRENT_MAX_ROWS, what
decode and verify windows are: bit-identical to decoding the rows one by one) and the chunked one
for long ones (prefill). fla is never imported at module import.

The conv: a depthwise causal conv1d of width W over the `C` mixed q/k/v channels (no bias, SiLU
after it, applied by the layer). Its state is the last W - 1 inputs `[W-1, C]` (time-major, oldest
first); `causal_conv_reference` returns the history `[W-1+T, C]` = (state, inputs): the conv state
after row t is `history[t+1 : t+W]`, a slice, so no per-row conv state is ever computed.
"""
from __future__ import annotations

import torch

RECURRENT_MAX_ROWS = 16     # runs up to this many rows use the token-by-token form
CHUNK_SIZE = 64
L2_EPS = 1e-6               # transformers' / fla's l2norm eps


def l2norm(x: torch.Tensor, eps: float = L2_EPS) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim (transformers' Qwen3-Next `l2norm`)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _check(q, k, v, g, beta, state):
    if q.dim() != 3 or k.shape != q.shape:
        raise ValueError(f"q, k: expected [T, H, K] of the same shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    T, H, K = q.shape
    if v.dim() != 3 or v.shape[:2] != (T, H):
        raise ValueError(f"v: expected [T={T}, H={H}, V], got {tuple(v.shape)} (repeat q/k to the value heads first)")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (T, H):
            raise ValueError(f"{name}: expected [T={T}, H={H}], got {tuple(t.shape)}")
    if state is not None and state.shape != (H, K, v.shape[2]):
        raise ValueError(f"state: expected [H={H}, K={K}, V={v.shape[2]}], got {tuple(state.shape)}")


def _prep(q, k, v, g, beta, state, scale):
    _check(q, k, v, g, beta, state)
    T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    s = torch.zeros(H, K, v.shape[2], device=q.device) if state is None else state.float().clone()
    return q * scale, k, v, g, beta, s


def first_kept_row(T: int, keep_from: int | None) -> int:
    """The first row whose state a run keeps (None: T - 1, the final state only), checked."""
    keep_from = T - 1 if keep_from is None else keep_from
    if not 0 <= keep_from <= max(T - 1, 0):
        raise ValueError(f"keep_from={keep_from}: must be a row of the run, 0..{T - 1}")
    return keep_from


def token_by_token(step, state: torch.Tensor, num_rows: int, keep_from: int):
    """The token-by-token form of a recurrence: `state, out_t = step(t, state)` for t = 0 .. T-1 ->
    (the outputs stacked `[T, ...]`, the states after rows keep_from .. T-1 stacked `[T-keep_from, ...]`)."""
    outs, kept = [], []
    for t in range(num_rows):
        state, out = step(t, state)
        outs.append(out)
        if t >= keep_from:
            kept.append(state)
    return torch.stack(outs), torch.stack(kept)


def gated_delta_recurrent_reference(q, k, v, g, beta, state=None, scale=None, keep_from: int | None = None):
    """q, k `[T, H, K]`; v `[T, H, V]`; g (log decay), beta `[T, H]`; state `[H, K, V]` (None: zeros).
    -> (o `[T, H, V]` float32, states `[T - keep_from, H, K, V]` float32: the state after each row
    from `keep_from` on; keep_from None: T - 1, the final state only)."""
    T = q.shape[0]
    keep_from = first_kept_row(T, keep_from)
    q, k, v, g, beta, s = _prep(q, k, v, g, beta, state, scale)

    def step(t, s):
        s = s * g[t].exp()[:, None, None]
        recalled = (s * k[t][:, :, None]).sum(dim=1)                   # k_t^T S   [H, V]
        delta = (v[t] - recalled) * beta[t][:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        return s, (s * q[t][:, :, None]).sum(dim=1)
    return token_by_token(step, s, T, keep_from)


def gated_delta_chunk_reference(q, k, v, g, beta, state=None, scale=None, keep_from: int | None = None,
                                chunk_size: int = CHUNK_SIZE):
    """The chunked (WY) form of `gated_delta_recurrent_reference`, same arguments and results (equal to
    float32 rounding, not bit for bit: the sums run in another order).

    Per chunk of C rows with cumulative log decay G: the rows' corrected values
    `u = (I + tril(diag(beta) K K^T * decay, -1))^-1 (beta V - beta K exp(G) S0)` (a triangular
    solve), then `o = exp(G) Q S0 + tril(Q K^T * decay) u` and `S_t = exp(G_t) S0 + sum_{s<=t}
    exp(G_t - G_s) k_s u_s^T`: every kept row's state is a masked sum, never a token loop."""
    T = q.shape[0]
    keep_from = first_kept_row(T, keep_from)
    q, k, v, g, beta, s = _prep(q, k, v, g, beta, state, scale)
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    kept = []
    for c0 in range(0, T, chunk_size):
        rows = slice(c0, min(T, c0 + chunk_size))
        qc, kc, vc, bc = (x[rows].transpose(0, 1) for x in (q, k, v, beta))   # [H, C, .]
        G = g[rows].transpose(0, 1).cumsum(-1)                                 # [H, C]
        n = G.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = (G[:, :, None] - G[:, None, :]).masked_fill(~causal, float("-inf")).exp()   # [H, C, C]
        strict = (bc[:, :, None] * (kc @ kc.transpose(1, 2)) * decay).tril(-1)
        eye = torch.eye(n, device=q.device).expand_as(strict)
        rhs = bc[:, :, None] * (vc - (kc * G.exp()[:, :, None]) @ s)
        u = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)   # [H, C, V]
        o[rows] = ((qc * G.exp()[:, :, None]) @ s + ((qc @ kc.transpose(1, 2)) * decay) @ u).transpose(0, 1)
        last = c0 + n - 1
        want = [t - c0 for t in range(max(c0, keep_from), last + 1)]
        if want:
            idx = torch.tensor(want, device=q.device)
            w = decay[:, idx, :]                                               # [H, w, C]
            states = G.exp()[:, idx, None, None] * s[:, None] + torch.einsum("hwc,hck,hcv->hwkv", w, kc, u)
            kept.extend(states.unbind(1))
        s = G[:, -1].exp()[:, None, None] * s + torch.einsum("hc,hck,hcv->hkv", decay[:, -1], kc, u)
    return o, (torch.stack(kept) if kept else s[None])


def causal_conv_reference(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor | None = None):
    """Depthwise causal conv, before its activation. x `[..., T, C]`; weight `[C, W]` (nn.Conv1d's
    `[C, 1, W]` squeezed); conv_state `[..., W-1, C]`, the inputs before x, oldest first (None: zeros).
    -> (y `[..., T, C]`, history `[..., W-1+T, C]`): y_t = sum_j weight[:, j] * history[t + j]; the
    conv state after row t is `history[..., t+1 : t+W, :]`.

    Written as W multiply-adds in a fixed order, so a row's output does not depend on how many rows
    or sequences run with it (one-row decoding and a window agree bit for bit)."""
    if x.dim() < 2 or weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"x [..., T, C], weight [C, W]: got {tuple(x.shape)} and {tuple(weight.shape)}")
    C, W = weight.shape
    T = x.shape[-2]
    if conv_state is None:
        conv_state = x.new_zeros(*x.shape[:-2], W - 1, C)
    if conv_state.shape != (*x.shape[:-2], W - 1, C):
        raise ValueError(f"conv_state: expected [..., W-1={W - 1}, C={C}] matching x, got {tuple(conv_state.shape)}")
    history = torch.cat([conv_state.to(x.dtype), x], dim=-2)
    w = weight.to(x.dtype)
    y = history[..., 0:T, :] * w[:, 0]
    for j in range(1, W):
        y = y + history[..., j:j + T, :] * w[:, j]
    return y, history


def fla_available(device) -> bool:
    """fla's kernels can run for tensors on `device`: CUDA, and `fla` imports (fla-core installed)."""
    if torch.device(device).type != "cuda":
        return False
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception:   # noqa: BLE001 - any import failure (no fla, no triton) means: use the reference
        return False
    return True


def gated_delta_fla(q, k, v, g, beta, state=None, scale=None, keep_from: int | None = None):
    """fla's kernels, same arguments and results as the references (CUDA only). The final state comes
    from `chunk_gated_delta_rule` (one call); the states of earlier kept rows from
    `fused_recurrent_gated_delta_rule` over the prefix up to each (fla returns only final states)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    _check(q, k, v, g, beta, state)
    T, H, K = q.shape
    keep_from = first_kept_row(T, keep_from)
    h0 = (torch.zeros(H, K, v.shape[2], device=q.device) if state is None else state.float())[None]
    args = dict(scale=K ** -0.5 if scale is None else scale, output_final_state=True)
    q4, k4, v4, g4, b4 = (x[None] for x in (q, k, v, g.float(), beta))
    run = fused_recurrent_gated_delta_rule if T <= RECURRENT_MAX_ROWS else chunk_gated_delta_rule
    # g and beta by name: fla 0.6's fused_recurrent_gated_delta_rule takes (q, k, v, g, gk, gv, beta, ...),
    # so a fifth positional argument is its per-key decay gk, not beta (chunk_gated_delta_rule's is beta)
    o, final = run(q4, k4, v4, g=g4, beta=b4, initial_state=h0, **args)
    kept = [fused_recurrent_gated_delta_rule(q4[:, :t + 1], k4[:, :t + 1], v4[:, :t + 1], g=g4[:, :t + 1],
                                             beta=b4[:, :t + 1], initial_state=h0, **args)[1][0]
            for t in range(keep_from, T - 1)]
    return o[0].float(), torch.stack(kept + [final[0].float()])


def gated_delta_rule(q, k, v, g, beta, state=None, scale=None, keep_from: int | None = None, backend: str = "auto"):
    """The recurrence on the backend that fits: fla (CUDA, fla importable, backend not `torch`),
    else the torch references (recurrent up to RECURRENT_MAX_ROWS rows, chunked beyond).
    Arguments and results as `gated_delta_recurrent_reference`."""
    if backend != "torch" and fla_available(q.device):
        return gated_delta_fla(q, k, v, g, beta, state, scale, keep_from)
    if q.shape[0] <= RECURRENT_MAX_ROWS:
        return gated_delta_recurrent_reference(q, k, v, g, beta, state, scale, keep_from)
    return gated_delta_chunk_reference(q, k, v, g, beta, state, scale, keep_from)
