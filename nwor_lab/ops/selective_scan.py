"""Mamba2's selective scan (scalar decay per head): the recurrence of a Mamba2 layer, in torch.

One sequence, `T` tokens, `H` heads of size `P`, state size `N` (B and C already repeated from
their groups to the heads, as q/k are for gated DeltaNet). The state h `[H, N, P]` is float32.
Per token t and head (A < 0 per head, dt_t > 0 per row and head, after the layer's softplus):

    h    = exp(dt_t * A) * h + dt_t * B_t x_t^T      # decay, then a rank-one write: B_t [N], x_t [P]
    y_t  = C_t^T h  (+ D * x_t)                      # read: C_t [N] -> [P]; D a per-head skip

The identity row: dt_t = 0 gives exp(0 * A) = exp(-0.0) = 1 exactly and a write of (0 * B_t) x_t^T
= +-0, so h passes bit for bit (what the state strategies run rejected and padding rows with).

Two references, same arguments and results:
  `selective_scan_reference`         token by token, vectorised over heads (the decode / verify form:
                                     each state is elementwise ops only, so a row's state does not
                                     depend on how many rows or heads run with it)
  `selective_scan_chunk_reference`   the whole run at once (SSD's quadratic form): with cumulative
                                     log decay c_t = sum_{s<=t} dt_s A, h_t = exp(c_t) h_0 +
                                     sum_{s<=t} exp(c_t - c_s) dt_s B_s x_s^T; equal to float32
                                     rounding, not bit for bit
Both return the output and the states after rows `keep_from .. T-1` (None: the final state only).
No kernel: the lab's GPU path for hybrids is gated DeltaNet (fla-core); this one shows that the
state store takes another recurrence (nwor_lab.state.mamba2).
"""
from __future__ import annotations

import torch

from nwor_lab.ops.gated_delta import first_kept_row, token_by_token


def _prep(x, dt, A, B, C, D, state):
    if x.dim() != 3:
        raise ValueError(f"x: expected [T, H, P], got {tuple(x.shape)}")
    T, H, P = x.shape
    if dt.shape != (T, H):
        raise ValueError(f"dt: expected [T={T}, H={H}], got {tuple(dt.shape)}")
    if B.dim() != 3 or B.shape[:2] != (T, H) or C.shape != B.shape:
        raise ValueError(f"B, C: expected [T={T}, H={H}, N] of the same shape (repeat the groups to the heads "
                         f"first), got {tuple(B.shape)} and {tuple(C.shape)}")
    N = B.shape[2]
    if A.shape != (H,) or (D is not None and D.shape != (H,)):
        raise ValueError(f"A, D: expected [H={H}] per head, got {tuple(A.shape)} and "
                         f"{None if D is None else tuple(D.shape)}")
    if state is not None and state.shape != (H, N, P):
        raise ValueError(f"state: expected [H={H}, N={N}, P={P}], got {tuple(state.shape)}")
    x, dt, A, B, C = (t.float() for t in (x, dt, A, B, C))
    h = torch.zeros(H, N, P, device=x.device) if state is None else state.float().clone()
    return x, dt, A, B, C, h


def selective_scan_reference(x, dt, A, B, C, D=None, state=None, keep_from: int | None = None):
    """x `[T, H, P]`; dt `[T, H]`; A `[H]` (< 0); B, C `[T, H, N]`; D `[H]` or None; state `[H, N, P]`
    (None: zeros) -> (y `[T, H, P]` float32, states `[T - keep_from, H, N, P]` float32: the state after
    each row from `keep_from` on)."""
    T = x.shape[0]
    keep_from = first_kept_row(T, keep_from)
    x, dt, A, B, C, h = _prep(x, dt, A, B, C, D, state)

    def step(t, h):
        h = (dt[t] * A).exp()[:, None, None] * h + (dt[t][:, None] * B[t])[:, :, None] * x[t][:, None, :]
        return h, (C[t][:, :, None] * h).sum(dim=1)
    y, kept = token_by_token(step, h, T, keep_from)
    return (y if D is None else y + D.float()[:, None] * x), kept


def selective_scan_chunk_reference(x, dt, A, B, C, D=None, state=None, keep_from: int | None = None):
    """`selective_scan_reference` without a token loop (same arguments and results, to float32
    rounding): decay[t, s] = exp(c_t - c_s) for s <= t (0 above the diagonal), per head."""
    T = x.shape[0]
    keep_from = first_kept_row(T, keep_from)
    x, dt, A, B, C, h0 = _prep(x, dt, A, B, C, D, state)
    c = (dt * A).cumsum(0).transpose(0, 1)                                     # [H, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    decay = (c[:, :, None] - c[:, None, :]).masked_fill(~causal, float("-inf")).exp()      # [H, T, T]
    u = (dt[:, :, None] * x).transpose(0, 1)                                   # dt_s x_s   [H, T, P]
    Bh, Ch = B.transpose(0, 1), C.transpose(0, 1)                              # [H, T, N]
    y = ((Ch @ Bh.transpose(1, 2)) * decay) @ u + c.exp()[:, :, None] * (Ch @ h0)     # [H, T, P]
    y = y.transpose(0, 1)
    if D is not None:
        y = y + D.float()[:, None] * x
    states = c[:, keep_from:].exp()[:, :, None, None] * h0[:, None] \
        + torch.einsum("hws,hsn,hsp->hwnp", decay[:, keep_from:], Bh, u)      # [H, T - keep_from, N, P]
    return y, states.transpose(0, 1)
